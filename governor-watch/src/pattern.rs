//! Which file a path or glob designates, and which directories must be watched to notice
//! when that changes.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use glob::{MatchOptions, Pattern};

use super::WatchError;

/// A path to follow: a literal absolute path, or a glob whose newest match is followed.
#[derive(Clone, Debug)]
pub(crate) enum PathPattern {
    Literal(PathBuf),
    Glob {
        text: String,
        /// Index of the first component with a glob character.
        first_glob: usize,
        components: Vec<String>,
    },
}

const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

fn has_glob_chars(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

impl PathPattern {
    pub(crate) fn new(path: &Path) -> Result<Self, WatchError> {
        if !path.is_absolute() {
            return Err(WatchError::RelativePath(path.to_owned()));
        }
        let Some(text) = path.to_str().filter(|s| has_glob_chars(s)) else {
            return Ok(PathPattern::Literal(normalise(path)));
        };
        Pattern::new(text).map_err(|e| WatchError::BadPattern {
            pattern: text.to_owned(),
            message: e.to_string(),
        })?;
        let components: Vec<String> = path
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let first_glob = components
            .iter()
            .position(|c| has_glob_chars(c))
            .unwrap_or(components.len() - 1);
        Ok(PathPattern::Glob {
            text: text.to_owned(),
            first_glob,
            components,
        })
    }

    /// The directory this pattern names, when it names one (a log directory: TensorBoard's,
    /// MLflow's); `None` for a file or a glob.
    pub(crate) fn log_dir(&self) -> Option<PathBuf> {
        match self {
            PathPattern::Literal(p) if p.is_dir() => Some(p.clone()),
            _ => None,
        }
    }

    /// Whether a change to the entry `name` of the watched directory `dir` can change what
    /// this pattern designates (so that a busy directory does not rescan every pattern
    /// watching it).
    pub(crate) fn affected_by(&self, dir: &Path, name: &OsStr) -> bool {
        match self {
            PathPattern::Literal(p) => {
                let Ok(rest) = p.strip_prefix(dir) else {
                    return true;
                };
                // An SQLite database's journal (`mlflow.db-journal`) comes and goes with each
                // of its writer's commits.
                let journal = rest.components().count() == 1
                    && p.file_name().zip(name.to_str()).is_some_and(|(f, n)| {
                        f.to_str()
                            .is_some_and(|f| n.strip_prefix(f).is_some_and(|r| r.starts_with('-')))
                    });
                journal
                    || rest
                        .components()
                        .next()
                        .is_none_or(|c| c.as_os_str() == name)
            }
            PathPattern::Glob { components, .. } => {
                let depth = dir.components().count();
                let Some(component) = components.get(depth) else {
                    return true;
                };
                let Some(name) = name.to_str() else {
                    return true;
                };
                Pattern::new(component).map_or(true, |pat| pat.matches_with(name, OPTIONS))
            }
        }
    }

    /// Directories whose entries decide which file this pattern designates: the file's
    /// directory (every directory a glob's directory part matches), or, while that does not
    /// exist yet, its deepest existing ancestor.
    pub(crate) fn directories(&self) -> Vec<PathBuf> {
        match self {
            PathPattern::Literal(p) if p.is_dir() => crate::log_dir_directories(p),
            PathPattern::Literal(p) => {
                let parent = p.parent().unwrap_or(Path::new("/"));
                vec![existing_ancestor(parent)]
            }
            PathPattern::Glob {
                first_glob,
                components,
                ..
            } => {
                let base: PathBuf = components[..*first_glob].iter().collect();
                if !base.is_dir() {
                    return vec![existing_ancestor(&base)];
                }
                let mut dirs = vec![base];
                // Directory components from the first glob one to the last directory.
                for j in *first_glob..components.len().saturating_sub(1) {
                    let prefix: PathBuf = components[..=j].iter().collect();
                    let Some(prefix) = prefix.to_str() else {
                        continue;
                    };
                    if let Ok(paths) = glob::glob_with(prefix, OPTIONS) {
                        dirs.extend(paths.flatten().filter(|p| p.is_dir()));
                    }
                }
                dirs
            }
        }
    }

    /// The file this pattern designates now: the path if it exists, or the glob's most
    /// recently modified match (ties: the greatest path).
    pub(crate) fn current_file(&self) -> Option<PathBuf> {
        match self {
            PathPattern::Literal(p) => std::fs::symlink_metadata(p).is_ok().then(|| p.clone()),
            PathPattern::Glob { text, .. } => {
                let mut best: Option<(SystemTime, PathBuf)> = None;
                for p in glob::glob_with(text, OPTIONS).ok()?.flatten() {
                    let Ok(meta) = std::fs::metadata(&p) else {
                        continue;
                    };
                    if meta.is_dir() {
                        continue;
                    }
                    let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    if best.as_ref().is_none_or(|(t, bp)| (mtime, &p) > (*t, bp)) {
                        best = Some((mtime, p));
                    }
                }
                best.map(|(_, p)| p)
            }
        }
    }
}

/// Removes `.` and resolves `..` lexically (no symlinks followed: the daemon passes host paths
/// it resolved itself).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|a| a.is_dir())
        .unwrap_or(Path::new("/"))
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_and_glob_patterns() {
        assert!(matches!(
            PathPattern::new(Path::new("relative.log")),
            Err(WatchError::RelativePath(_))
        ));
        assert!(matches!(
            PathPattern::new(Path::new("/a/./b/../c.log")).unwrap(),
            PathPattern::Literal(p) if p == Path::new("/a/c.log")
        ));
        assert!(matches!(
            PathPattern::new(Path::new("/a/[b.log")),
            Err(WatchError::BadPattern { .. })
        ));
        let PathPattern::Glob { first_glob, .. } =
            PathPattern::new(Path::new("/x/lightning_logs/version_*/metrics.csv")).unwrap()
        else {
            panic!("not a glob")
        };
        assert_eq!(first_glob, 3);
    }

    #[test]
    fn directories_and_newest_match() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let pat = PathPattern::new(&root.join("logs/version_*/metrics.csv")).unwrap();
        // Nothing exists yet: watch the deepest existing ancestor.
        assert_eq!(pat.directories(), vec![root.to_owned()]);
        assert_eq!(pat.current_file(), None);
        std::fs::create_dir_all(root.join("logs/version_0")).unwrap();
        std::fs::create_dir_all(root.join("logs/version_1")).unwrap();
        let mut dirs = pat.directories();
        dirs.sort();
        assert_eq!(
            dirs,
            vec![
                root.join("logs"),
                root.join("logs/version_0"),
                root.join("logs/version_1")
            ]
        );
        std::fs::write(root.join("logs/version_1/metrics.csv"), "a").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let f = std::fs::File::options()
            .write(true)
            .open(root.join("logs/version_1/metrics.csv"))
            .unwrap();
        f.set_modified(old).unwrap();
        std::fs::write(root.join("logs/version_0/metrics.csv"), "b").unwrap();
        assert_eq!(
            pat.current_file(),
            Some(root.join("logs/version_0/metrics.csv"))
        );
    }

    #[test]
    fn only_relevant_directory_entries_affect_a_pattern() {
        let lit = PathPattern::new(Path::new("/a/b/train.log")).unwrap();
        assert!(lit.affected_by(Path::new("/a/b"), OsStr::new("train.log")));
        assert!(!lit.affected_by(Path::new("/a/b"), OsStr::new("other.log")));
        assert!(lit.affected_by(Path::new("/a"), OsStr::new("b")));
        assert!(!lit.affected_by(Path::new("/a"), OsStr::new("c")));
        let glob = PathPattern::new(Path::new("/x/logs/version_*/metrics.csv")).unwrap();
        assert!(glob.affected_by(Path::new("/x/logs"), OsStr::new("version_3")));
        assert!(!glob.affected_by(Path::new("/x/logs"), OsStr::new("checkpoints")));
        assert!(glob.affected_by(Path::new("/x/logs/version_3"), OsStr::new("metrics.csv")));
        assert!(!glob.affected_by(Path::new("/x/logs/version_3"), OsStr::new("hparams.yaml")));
        assert!(glob.affected_by(Path::new("/x"), OsStr::new("logs")));
    }
}
