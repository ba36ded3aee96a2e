//! Just enough of a BTF reader to find the byte offsets of a few kernel struct fields.
//!
//! The eBPF programs follow `task->pid` and `task->cgroups->dfl_cgrp->kn->id` of the task being
//! switched in. C programs get these offsets from CO-RE relocations; Rust eBPF code gets none, so
//! the loader reads them from the running kernel's BTF (`/sys/kernel/btf/vmlinux`) and hands them
//! to the programs as constants. aya parses BTF too, but does not expose type lookups.
//!
//! Format: a header, a type section (records of `struct btf_type` followed by kind-specific data)
//! and a string section; type ids count from 1 in record order
//! (<https://docs.kernel.org/bpf/btf.html>).

use std::path::Path;

use governor_common::ProgramConfig;

/// Why the offsets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("BTF has no struct {0}")]
    NoStruct(String),
    #[error("struct {strukt} has no field {field} in this kernel's BTF")]
    NoField { strukt: String, field: String },
    #[error("{strukt}.{field} has size {size}, expected {expected}")]
    FieldSize {
        strukt: String,
        field: String,
        size: u32,
        expected: u32,
    },
    #[error("{strukt}.{field} is a bitfield or not byte aligned")]
    Bitfield { strukt: String, field: String },
}

const BTF_MAGIC: u16 = 0xeb9f;

// Kinds (include/uapi/linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// A parsed BTF blob: the type records are indexed, their members read on demand.
pub struct Btf {
    data: Vec<u8>,
    /// Byte offset (in `data`) of each type record; index 0 is type id 1.
    type_offsets: Vec<usize>,
    strings_start: usize,
    strings_len: usize,
}

/// One member of a struct or union.
#[derive(Debug, Clone, Copy)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
    bitfield_size: u32,
}

impl Btf {
    /// Reads and parses a BTF file (e.g. `/sys/kernel/btf/vmlinux`).
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Btf::parse(data)
    }

    /// Parses a little-endian BTF blob (the only byte order of the targets we build for).
    pub fn parse(data: Vec<u8>) -> Result<Btf, BtfError> {
        let u16_at = |o: usize| -> Option<u16> {
            Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?))
        };
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr = |i: usize| read_u32(&data, 4 + 4 * i).ok_or(BtfError::Malformed("short header"));
        let hdr_len = hdr(0)? as usize;
        let (type_off, type_len, str_off, str_len) = (
            hdr(1)? as usize,
            hdr(2)? as usize,
            hdr(3)? as usize,
            hdr(4)? as usize,
        );
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings_start = hdr_len + str_off;
        if types_end > data.len() || strings_start + str_len > data.len() {
            return Err(BtfError::Malformed("sections beyond the end of the data"));
        }
        let mut type_offsets = Vec::new();
        let mut at = types_start;
        while at < types_end {
            type_offsets.push(at);
            let info = read_u32(&data, at + 4).ok_or(BtfError::Malformed("short type record"))?;
            let vlen = (info & 0xffff) as usize;
            let extra = match (info >> 24) & 0x1f {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => return Err(BtfError::Malformed("unknown type kind")),
            };
            at += 12 + extra;
        }
        if at != types_end {
            return Err(BtfError::Malformed("type section does not end on a record"));
        }
        Ok(Btf {
            data,
            type_offsets,
            strings_start,
            strings_len: str_len,
        })
    }

    fn string(&self, off: u32) -> &[u8] {
        let off = off as usize;
        if off >= self.strings_len {
            return b"";
        }
        let s = &self.data[self.strings_start + off..self.strings_start + self.strings_len];
        &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
    }

    fn record(&self, type_id: u32) -> Option<usize> {
        self.type_offsets
            .get((type_id as usize).checked_sub(1)?)
            .copied()
    }

    /// (name_off, kind, vlen, kind_flag, size_or_type) of a type.
    fn header(&self, type_id: u32) -> Option<(u32, u32, u32, bool, u32)> {
        let at = self.record(type_id)?;
        let info = read_u32(&self.data, at + 4)?;
        Some((
            read_u32(&self.data, at)?,
            (info >> 24) & 0x1f,
            info & 0xffff,
            info >> 31 == 1,
            read_u32(&self.data, at + 8)?,
        ))
    }

    fn members(&self, type_id: u32) -> Vec<Member> {
        let Some((_, kind, vlen, kind_flag, _)) = self.header(type_id) else {
            return Vec::new();
        };
        if kind != KIND_STRUCT && kind != KIND_UNION {
            return Vec::new();
        }
        let at = self.record(type_id).unwrap_or_default() + 12;
        (0..vlen as usize)
            .filter_map(|i| {
                let m = at + 12 * i;
                let raw = read_u32(&self.data, m + 8)?;
                let (bit_offset, bitfield_size) = if kind_flag {
                    (raw & 0x00ff_ffff, raw >> 24)
                } else {
                    (raw, 0)
                };
                Some(Member {
                    name_off: read_u32(&self.data, m)?,
                    type_id: read_u32(&self.data, m + 4)?,
                    bit_offset,
                    bitfield_size,
                })
            })
            .collect()
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut type_id: u32) -> u32 {
        for _ in 0..32 {
            match self.header(type_id) {
                Some((
                    _,
                    KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG,
                    _,
                    _,
                    next,
                )) => type_id = next,
                _ => break,
            }
        }
        type_id
    }

    /// Size in bytes of a type (pointers are 8 bytes on our 64-bit targets).
    fn size_of(&self, type_id: u32) -> Option<u32> {
        let id = self.resolve(type_id);
        match self.header(id)? {
            (_, KIND_PTR, ..) => Some(8),
            (
                _,
                KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT,
                _,
                _,
                size,
            ) => Some(size),
            (_, KIND_ARRAY, ..) => {
                let at = self.record(id)? + 12;
                let elem = read_u32(&self.data, at)?;
                let n = read_u32(&self.data, at + 8)?;
                self.size_of(elem)?.checked_mul(n)
            }
            _ => None,
        }
    }

    /// The id of the struct named `name` (the first complete definition).
    fn struct_id(&self, name: &str) -> Option<u32> {
        (1..=self.type_offsets.len() as u32).find(|&id| {
            matches!(self.header(id), Some((name_off, KIND_STRUCT, vlen, _, _)) if vlen > 0 && self.string(name_off) == name.as_bytes())
        })
    }

    /// Byte offset and type of `field` in the struct or union `type_id`, looking inside anonymous
    /// struct/union members (as C does).
    fn find_member(&self, type_id: u32, field: &str, depth: u32) -> Option<(u32, u32, u32)> {
        if depth > 8 {
            return None;
        }
        for m in self.members(type_id) {
            let name = self.string(m.name_off);
            if name == field.as_bytes() {
                return Some((m.bit_offset, m.bitfield_size, m.type_id));
            }
            if name.is_empty()
                && let Some((off, bits, ty)) =
                    self.find_member(self.resolve(m.type_id), field, depth + 1)
            {
                return Some((m.bit_offset + off, bits, ty));
            }
        }
        None
    }

    /// Byte offset of `strukt.field` (`field` may be a path into nested structs, like
    /// `se.sum_exec_runtime`), checked to be byte aligned, not a bitfield and `size` bytes.
    pub fn field_offset(&self, strukt: &str, field: &str, size: u32) -> Result<u32, BtfError> {
        let no_field = || BtfError::NoField {
            strukt: strukt.to_owned(),
            field: field.to_owned(),
        };
        let mut ty = self
            .struct_id(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_owned()))?;
        let mut bits = 0u32;
        let mut last_bitfield = 0;
        for part in field.split('.') {
            let (bit_offset, bitfield_size, member_ty) = self
                .find_member(self.resolve(ty), part, 0)
                .ok_or_else(no_field)?;
            bits += bit_offset;
            last_bitfield = bitfield_size;
            ty = member_ty;
        }
        if last_bitfield != 0 || !bits.is_multiple_of(8) {
            return Err(BtfError::Bitfield {
                strukt: strukt.to_owned(),
                field: field.to_owned(),
            });
        }
        let actual = self.size_of(ty).unwrap_or(0);
        if actual != size {
            return Err(BtfError::FieldSize {
                strukt: strukt.to_owned(),
                field: field.to_owned(),
                size: actual,
                expected: size,
            });
        }
        Ok(bits / 8)
    }

    /// The offsets the accounting programs need (`flags` left 0 for the caller). The run-queue
    /// wait offset is `None` when the kernel keeps no `sched_info` (CONFIG_SCHED_INFO off).
    pub fn program_offsets(&self) -> Result<(ProgramConfig, bool), BtfError> {
        let run_delay = self.field_offset("task_struct", "sched_info.run_delay", 8);
        let config = ProgramConfig {
            task_pid: self.field_offset("task_struct", "pid", 4)?,
            task_cgroups: self.field_offset("task_struct", "cgroups", 8)?,
            task_sum_exec_runtime: self.field_offset("task_struct", "se.sum_exec_runtime", 8)?,
            task_run_delay: *run_delay.as_ref().unwrap_or(&0),
            css_set_dfl_cgrp: self.field_offset("css_set", "dfl_cgrp", 8)?,
            cgroup_kn: self.field_offset("cgroup", "kn", 8)?,
            kernfs_node_id: self.field_offset("kernfs_node", "id", 8)?,
            // Renamed `__parent` in 6.15 (it became RCU-protected).
            kernfs_node_parent: self
                .field_offset("kernfs_node", "parent", 8)
                .or_else(|_| self.field_offset("kernfs_node", "__parent", 8))?,
            flags: 0,
        };
        Ok((config, run_delay.is_ok()))
    }
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds little-endian BTF blobs for tests.
    #[derive(Default)]
    pub(crate) struct BtfBuilder {
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    impl BtfBuilder {
        pub(crate) fn new() -> Self {
            BtfBuilder {
                types: Vec::new(),
                strings: vec![0],
                next_id: 1,
            }
        }

        fn string(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn record(
            &mut self,
            name: &str,
            kind: u32,
            vlen: u32,
            kind_flag: bool,
            size_or_type: u32,
        ) -> u32 {
            let name_off = self.string(name);
            let info = (kind << 24) | vlen | if kind_flag { 1 << 31 } else { 0 };
            for w in [name_off, info, size_or_type] {
                self.types.extend_from_slice(&w.to_le_bytes());
            }
            self.next_id += 1;
            self.next_id - 1
        }

        pub(crate) fn int(&mut self, name: &str, size: u32) -> u32 {
            let id = self.record(name, KIND_INT, 0, false, size);
            self.types.extend_from_slice(&(size * 8).to_le_bytes());
            id
        }

        pub(crate) fn ptr(&mut self, to: u32) -> u32 {
            self.record("", KIND_PTR, 0, false, to)
        }

        pub(crate) fn typedef(&mut self, name: &str, to: u32) -> u32 {
            self.record(name, KIND_TYPEDEF, 0, false, to)
        }

        pub(crate) fn fwd(&mut self, name: &str) -> u32 {
            self.record(name, KIND_FWD, 0, false, 0)
        }

        /// `members`: (name, type id, bit offset, bitfield size).
        pub(crate) fn structure(
            &mut self,
            name: &str,
            size: u32,
            members: &[(&str, u32, u32, u32)],
        ) -> u32 {
            let kind_flag = members.iter().any(|m| m.3 != 0);
            let id = self.record(name, KIND_STRUCT, members.len() as u32, kind_flag, size);
            for &(n, ty, off, bits) in members {
                let name_off = self.string(n);
                let offset = if kind_flag { (bits << 24) | off } else { off };
                for w in [name_off, ty, offset] {
                    self.types.extend_from_slice(&w.to_le_bytes());
                }
            }
            id
        }

        pub(crate) fn union(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
            let id = self.record(name, KIND_UNION, members.len() as u32, false, size);
            for &(n, ty, off) in members {
                let name_off = self.string(n);
                for w in [name_off, ty, off] {
                    self.types.extend_from_slice(&w.to_le_bytes());
                }
            }
            id
        }

        pub(crate) fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
            out.push(1); // version
            out.push(0); // flags
            let hdr_len = 24u32;
            for w in [
                hdr_len,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// A miniature of the kernel's types with the fields the programs follow, at known offsets,
    /// the task's pid behind an anonymous struct (like randomized layouts) and a typedef.
    pub(crate) fn miniature_kernel_btf() -> Vec<u8> {
        let mut b = BtfBuilder::new();
        let int = b.int("int", 4);
        let u64_ = b.int("unsigned long long", 8);
        let pid_t = b.typedef("pid_t", int);
        let kn_fwd = b.fwd("kernfs_node");
        let kn_fwd_ptr = b.ptr(kn_fwd);
        let kernfs_node = b.structure(
            "kernfs_node",
            128,
            &[
                ("flags", int, 0, 0),
                ("__parent", kn_fwd_ptr, 16 * 8, 0),
                ("id", u64_, 64 * 8, 0),
            ],
        );
        let kn_ptr = b.ptr(kernfs_node);
        let cgroup = b.structure(
            "cgroup",
            512,
            &[("self", int, 0, 0), ("kn", kn_ptr, 296 * 8, 0)],
        );
        let cgroup_ptr = b.ptr(cgroup);
        let css_set = b.structure(
            "css_set",
            256,
            &[
                ("refcount", int, 0, 0),
                ("dfl_cgrp", cgroup_ptr, 136 * 8, 0),
            ],
        );
        let css_set_ptr = b.ptr(css_set);
        // A forward declaration with the same name must not be taken for the definition.
        b.fwd("task_struct");
        let anon = b.structure("", 16, &[("tgid", pid_t, 0, 0), ("pid", pid_t, 32, 0)]);
        let flags_union = b.union("", 4, &[("bits", int, 0)]);
        let sched_entity = b.structure(
            "sched_entity",
            256,
            &[
                ("exec_start", u64_, 64 * 8, 0),
                ("sum_exec_runtime", u64_, 72 * 8, 0),
            ],
        );
        let sched_info = b.structure(
            "sched_info",
            32,
            &[("pcount", u64_, 0, 0), ("run_delay", u64_, 8 * 8, 0)],
        );
        b.structure(
            "task_struct",
            9000,
            &[
                ("state_bits", int, 0, 3),
                ("", flags_union, 32, 0),
                ("se", sched_entity, 128 * 8, 0),
                ("sched_info", sched_info, 1000 * 8, 0),
                ("", anon, 2400 * 8, 0),
                ("cgroups", css_set_ptr, 3192 * 8, 0),
            ],
        );
        b.build()
    }

    #[test]
    fn finds_the_fields_the_programs_follow() {
        let btf = Btf::parse(miniature_kernel_btf()).unwrap();
        let (cfg, has_run_delay) = btf.program_offsets().unwrap();
        assert_eq!(
            cfg.task_pid, 2404,
            "pid is 4 bytes into the anonymous struct at 2400"
        );
        assert_eq!(
            cfg.task_sum_exec_runtime,
            128 + 72,
            "a field of a nested struct"
        );
        assert_eq!(cfg.task_run_delay, 1000 + 8);
        assert!(has_run_delay);
        assert_eq!(cfg.task_cgroups, 3192);
        assert_eq!(cfg.css_set_dfl_cgrp, 136);
        assert_eq!(cfg.cgroup_kn, 296);
        assert_eq!(cfg.kernfs_node_id, 64);
        assert_eq!(cfg.kernfs_node_parent, 16, "found under its 6.15+ name");
    }

    #[test]
    fn rejects_wrong_sizes_bitfields_and_missing_fields() {
        let btf = Btf::parse(miniature_kernel_btf()).unwrap();
        assert!(matches!(
            btf.field_offset("task_struct", "pid", 8),
            Err(BtfError::FieldSize { size: 4, .. })
        ));
        assert!(matches!(
            btf.field_offset("task_struct", "state_bits", 4),
            Err(BtfError::Bitfield { .. })
        ));
        assert!(matches!(
            btf.field_offset("task_struct", "comm", 16),
            Err(BtfError::NoField { .. })
        ));
        assert!(matches!(
            btf.field_offset("mm_struct", "pgd", 8),
            Err(BtfError::NoStruct(_))
        ));
        assert!(matches!(
            btf.field_offset("task_struct", "se.vruntime", 8),
            Err(BtfError::NoField { .. })
        ));
        assert!(matches!(
            btf.field_offset("task_struct", "pid.x", 8),
            Err(BtfError::NoField { .. })
        ));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(Btf::parse(Vec::new()).is_err());
        assert!(Btf::parse(vec![0x9f, 0xeb, 1, 0]).is_err());
        let mut blob = miniature_kernel_btf();
        blob.truncate(blob.len() - 40);
        assert!(Btf::parse(blob).is_err(), "truncated blob accepted");
        // An unknown kind in the first record.
        let mut blob = miniature_kernel_btf();
        blob[24 + 7] = 0x1f;
        assert!(Btf::parse(blob).is_err());
    }

    /// The real thing: the host kernel's BTF.
    #[test]
    fn reads_the_host_kernels_btf() {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        assert!(
            path.exists(),
            "{} is missing: the development machines' kernels (6.18) all have BTF; \
             eBPF accounting needs it (the daemon falls back to cpu.stat without it)",
            path.display()
        );
        let btf = Btf::from_file(path).unwrap();
        let (cfg, has_run_delay) = btf.program_offsets().unwrap();
        assert!(
            cfg.task_pid > 0 && cfg.task_cgroups > cfg.task_pid,
            "{cfg:?}"
        );
        assert!(
            cfg.cgroup_kn > 0 && cfg.task_sum_exec_runtime > 0,
            "{cfg:?}"
        );
        assert!(
            has_run_delay,
            "the host kernel keeps sched_info (CONFIG_SCHED_INFO)"
        );
    }
}
