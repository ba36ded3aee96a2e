//! placeholder
pub struct WatchEvent;
pub struct WatchEventKind;
pub struct WatchSpec;
pub struct Watcher;
pub struct WatcherHandle;
