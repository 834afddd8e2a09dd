//! The accounting file every process of a container shares: how much device memory each process
//! holds on each GPU.
//!
//! The file is an array of 64-byte records, one per (process, GPU), in the format of
//! `crishim_proto::vgpu::ledger`.
//!
//! Every read-modify-write happens under an exclusive `fcntl` lock on the whole file, which the
//! kernel releases when its holder dies, so a crash never wedges the others. Only a record's own
//! process writes it (besides reclaiming): a record with a bad checksum can only be a write its
//! dying owner did not finish, and is reclaimed like the record of any process that is gone, has
//! become a zombie, or whose pid now belongs to a younger process.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::os::unix::io::AsRawFd as _;
use std::path::PathBuf;

use crate::cuda::CUuuid;

use crishim_proto::vgpu::ledger::{Entry as Record, PROCESS, RECORD};

/// Whether a process is still there: how `/proc` answers, behind a trait so tests can decide.
pub trait Processes {
    /// This process's (pid, start time).
    fn me(&self) -> io::Result<(u32, u64)>;
    /// Whether `pid` is a live (non-zombie) process that started at `start`.
    fn alive(&self, pid: u32, start: u64) -> bool;
}

/// The real `/proc`.
pub struct Proc;

impl Processes for Proc {
    fn me(&self) -> io::Result<(u32, u64)> {
        let text = std::fs::read_to_string("/proc/self/stat")?;
        let (_, start) =
            parse_stat(&text).ok_or_else(|| io::Error::other("unparsable /proc/self/stat"))?;
        Ok((std::process::id(), start))
    }

    fn alive(&self, pid: u32, start: u64) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(text) => parse_stat(&text)
                .is_some_and(|(state, s)| s == start && !matches!(state, 'Z' | 'X')),
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            // Unsure: keep its share rather than hand out memory a live process may hold.
            Err(_) => true,
        }
    }
}

/// (state, start time) from a `/proc/<pid>/stat` line; the command may contain spaces and
/// parentheses, so fields are counted after the last `)`.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 is the state; start time is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

pub struct Ledger {
    path: PathBuf,
    /// The open file and the pid that opened it: a forked child must open its own, since
    /// `fcntl` locks belong to processes.
    file: Option<(u32, File)>,
    procs: Box<dyn Processes + Send>,
}

impl Ledger {
    pub fn new(path: PathBuf) -> Self {
        Self::with_processes(path, Box::new(Proc))
    }

    pub fn with_processes(path: PathBuf, procs: Box<dyn Processes + Send>) -> Self {
        Ledger {
            path,
            file: None,
            procs,
        }
    }

    /// Add `bytes` to this process's share of `uuid` if the container's total stays within
    /// `limit`; `Ok(false)` when it would not.
    pub fn reserve(&mut self, uuid: &CUuuid, bytes: u64, limit: u64) -> io::Result<bool> {
        self.update(|me, table| {
            // Saturating: records are the container's to write, and a wrapped sum would
            // let any allocation through.
            let total = table.live(uuid).fold(0, u64::saturating_add);
            if total.saturating_add(bytes) > limit {
                return false;
            }
            table.adjust(me, uuid, |u| u.saturating_add(bytes));
            true
        })
    }

    /// Give back `bytes` of this process's share of `uuid`.
    pub fn release(&mut self, uuid: &CUuuid, bytes: u64) -> io::Result<()> {
        self.update(|me, table| table.adjust(me, uuid, |u| u.saturating_sub(bytes)))
    }

    /// Move this process's share of `uuid` by what something it charged there went from, `from`
    /// bytes, to `to`, whatever the limit: for memory the driver has already taken (a context,
    /// a pool's cache), which the container must still see.
    pub fn rebase(&mut self, uuid: &CUuuid, from: u64, to: u64) -> io::Result<()> {
        self.update(|me, table| {
            table.adjust(me, uuid, |u| {
                if to >= from {
                    u.saturating_add(to - from)
                } else {
                    u.saturating_sub(from - to)
                }
            })
        })
    }

    /// The whole container's usage of `uuid`.
    pub fn used(&mut self, uuid: &CUuuid) -> io::Result<u64> {
        self.update(|_, table| table.live(uuid).fold(0, u64::saturating_add))
    }

    /// Record this process's pid as the driver names it.
    pub fn set_host_pid(&mut self, host_pid: u32) -> io::Result<()> {
        self.update(|me, table| table.process(me, |r| r.host_pid = host_pid))
    }

    /// Add to the time this process's launches were held back.
    pub fn add_throttled(&mut self, us: u64) -> io::Result<()> {
        self.update(|me, table| {
            table.process(me, |r| r.throttled_us = r.throttled_us.saturating_add(us))
        })
    }

    /// Add `gpu_ns` of GPU time and `throttled_us` of held-back launches to this process's
    /// record, and set its last whole second's share (`(second, permille)`) where there is one.
    /// Returns the GPU time charged to the container's other processes, live and gone, ns.
    pub fn flush_gpu_time(
        &mut self,
        gpu_ns: u64,
        throttled_us: u64,
        window: Option<(u64, u32)>,
    ) -> io::Result<u64> {
        self.update(|me, table| {
            table.process(me, |r| {
                r.used = r.used.saturating_add(gpu_ns);
                r.throttled_us = r.throttled_us.saturating_add(throttled_us);
                if let Some((second, permille)) = window {
                    r.window = crishim_proto::vgpu::ledger::window(second, permille);
                }
            });
            table
                .slots
                .iter()
                .flatten()
                .filter(|r| r.uuid == PROCESS && (r.pid, r.start) != me)
                .fold(0u64, |sum, r| sum.saturating_add(r.used))
        })
    }

    /// The host pids of the container's live processes that have one recorded.
    pub fn host_pids(&mut self) -> io::Result<Vec<u32>> {
        self.update(|_, table| {
            table
                .slots
                .iter()
                .flatten()
                .filter(|r| r.uuid == PROCESS && r.host_pid != 0 && !r.is_totals())
                .map(|r| r.host_pid)
                .collect()
        })
    }

    /// Lock, read, reclaim, run `f`, write what changed, unlock.
    fn update<R>(&mut self, f: impl FnOnce((u32, u64), &mut Table) -> R) -> io::Result<R> {
        let me = self.procs.me()?;
        if self.file.as_ref().is_none_or(|(pid, _)| *pid != me.0) {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o666)
                .custom_flags(libc::O_CLOEXEC)
                .open(&self.path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))?;
            self.file = Some((me.0, file));
        }
        let Some((_, file)) = &self.file else {
            unreachable!("opened above")
        };
        let _lock = FileLock::take(file)?;
        let len = file.metadata()?.len() as usize;
        let mut raw = vec![0u8; len - len % RECORD];
        file.read_exact_at(&mut raw, 0)?;
        let mut table = Table::parse(&raw);
        table.reclaim(|r| self.procs.alive(r.pid, r.start) || (r.pid, r.start) == me);
        let out = f(me, &mut table);
        for (i, rec) in table.dirty() {
            let bytes = rec.map_or([0u8; RECORD], |r| r.encode());
            file.write_all_at(&bytes, (i * RECORD) as u64)?;
        }
        Ok(out)
    }
}

/// The records of one locked read.
struct Table {
    slots: Vec<Option<Record>>,
    dirty: HashMap<usize, ()>,
}

impl Table {
    fn parse(raw: &[u8]) -> Table {
        let slots: Vec<Option<Record>> = raw.chunks(RECORD).map(Record::decode).collect();
        // A torn record (magic set, checksum wrong) is rewritten as free.
        let dirty = raw
            .chunks(RECORD)
            .enumerate()
            .filter(|(i, c)| slots[*i].is_none() && c.iter().any(|b| *b != 0))
            .map(|(i, _)| (i, ()))
            .collect();
        Table { slots, dirty }
    }

    /// Free the records of processes that are gone; their throttled and GPU time move to the
    /// totals.
    fn reclaim(&mut self, alive: impl Fn(&Record) -> bool) {
        let (mut gone_throttled, mut gone_gpu_ns) = (0u64, 0u64);
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(r) = s.filter(|r| !r.is_totals() && !alive(r)) {
                gone_throttled = gone_throttled.saturating_add(r.throttled_us);
                if r.uuid == PROCESS {
                    gone_gpu_ns = gone_gpu_ns.saturating_add(r.used);
                }
                *s = None;
                self.dirty.insert(i, ());
            }
        }
        if gone_throttled > 0 || gone_gpu_ns > 0 {
            let i = self.slot_of((0, 0), &PROCESS);
            if let Some(r) = &mut self.slots[i] {
                r.throttled_us = r.throttled_us.saturating_add(gone_throttled);
                r.used = r.used.saturating_add(gone_gpu_ns);
            }
        }
    }

    fn live<'a>(&'a self, uuid: &'a CUuuid) -> impl Iterator<Item = u64> + 'a {
        self.slots
            .iter()
            .flatten()
            .filter(move |r| r.uuid == uuid.bytes)
            .map(|r| r.used)
    }

    /// The index of the record of (process, uuid), made (and marked dirty) if there is none.
    fn slot_of(&mut self, me: (u32, u64), uuid: &[u8; 16]) -> usize {
        let found = self.slots.iter().position(|s| {
            s.as_ref()
                .is_some_and(|r| (r.pid, r.start) == me && r.uuid == *uuid)
        });
        let i = found.unwrap_or_else(|| {
            let i = self
                .slots
                .iter()
                .position(Option::is_none)
                .unwrap_or(self.slots.len());
            if i == self.slots.len() {
                self.slots.push(None);
            }
            self.slots[i] = Some(Record {
                pid: me.0,
                start: me.1,
                uuid: *uuid,
                used: 0,
                host_pid: 0,
                window: 0,
                throttled_us: 0,
            });
            i
        });
        self.dirty.insert(i, ());
        i
    }

    fn adjust(&mut self, me: (u32, u64), uuid: &CUuuid, f: impl FnOnce(u64) -> u64) {
        let i = self.slot_of(me, &uuid.bytes);
        if let Some(r) = &mut self.slots[i] {
            r.used = f(r.used);
            if r.used == 0 {
                self.slots[i] = None;
            }
        }
    }

    /// Change this process's process record (kept while the process lives, even if empty).
    fn process(&mut self, me: (u32, u64), f: impl FnOnce(&mut Record)) {
        let i = self.slot_of(me, &PROCESS);
        if let Some(r) = &mut self.slots[i] {
            f(r);
        }
    }

    fn dirty(&self) -> impl Iterator<Item = (usize, Option<Record>)> + '_ {
        self.dirty.keys().map(|&i| (i, self.slots[i]))
    }
}

/// An exclusive `fcntl` lock on a whole file, released on drop (or by the kernel at death).
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn take(file: &'a File) -> io::Result<Self> {
        loop {
            match set_lock(file, libc::F_WRLCK as i16, libc::F_SETLKW) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.map(|()| FileLock(file)),
            }
        }
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = set_lock(self.0, libc::F_UNLCK as i16, libc::F_SETLK);
    }
}

fn set_lock(file: &File, typ: i16, cmd: i32) -> io::Result<()> {
    // SAFETY: flock is plain data; zeroed then filled in: whole file (start 0, length 0).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: fcntl on an open descriptor with a valid flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Process = (u32, u64);

    /// Processes by (pid, start) that tests mark alive or dead; `me` is switchable.
    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<(Option<Process>, Vec<Process>)>>);

    impl Fake {
        fn be(&self, pid: u32, start: u64) {
            let mut s = self.0.lock().unwrap();
            s.0 = Some((pid, start));
            if !s.1.contains(&(pid, start)) {
                s.1.push((pid, start));
            }
        }
        fn kill(&self, pid: u32) {
            self.0.lock().unwrap().1.retain(|(p, _)| *p != pid);
        }
    }

    impl Processes for Fake {
        fn me(&self) -> io::Result<(u32, u64)> {
            Ok(self.0.lock().unwrap().0.expect("me set"))
        }
        fn alive(&self, pid: u32, start: u64) -> bool {
            self.0.lock().unwrap().1.contains(&(pid, start))
        }
    }

    const GPU0: CUuuid = CUuuid { bytes: [2; 16] };
    const GPU1: CUuuid = CUuuid { bytes: [1; 16] };
    const MIB: u64 = 1 << 20;

    fn ledger(dir: &tempfile::TempDir, procs: &Fake) -> Ledger {
        Ledger::with_processes(dir.path().join("usage"), Box::new(procs.clone()))
    }

    #[test]
    fn processes_share_one_limit_per_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let procs = Fake::default();
        let mut l = ledger(&dir, &procs);
        procs.be(10, 100);
        assert!(l.reserve(&GPU0, 300 * MIB, 512 * MIB).unwrap());
        procs.be(11, 110);
        assert!(!l.reserve(&GPU0, 300 * MIB, 512 * MIB).unwrap());
        assert!(
            l.reserve(&GPU1, 300 * MIB, 512 * MIB).unwrap(),
            "another GPU"
        );
        assert!(l.reserve(&GPU0, 200 * MIB, 512 * MIB).unwrap());
        assert_eq!(l.used(&GPU0).unwrap(), 500 * MIB);
        l.release(&GPU0, 200 * MIB).unwrap();
        assert_eq!(l.used(&GPU0).unwrap(), 300 * MIB);
    }

    #[test]
    fn shares_summing_past_u64_hold_everything_rather_than_wrap_to_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let procs = Fake::default();
        let half = |pid| {
            Record {
                pid,
                start: 100,
                uuid: GPU0.bytes,
                used: 1 << 63,
                host_pid: 0,
                window: 0,
                throttled_us: 0,
            }
            .encode()
        };
        std::fs::write(dir.path().join("usage"), [half(10), half(11)].concat()).unwrap();
        procs.be(10, 100);
        procs.be(11, 100);
        procs.be(12, 100);
        let mut l = ledger(&dir, &procs);
        assert!(!l.reserve(&GPU0, MIB, u64::MAX - 1).unwrap());
        assert_eq!(l.used(&GPU0).unwrap(), u64::MAX);
    }

    #[test]
    fn a_dead_or_reused_pid_gives_its_share_back() {
        let dir = tempfile::tempdir().unwrap();
        let procs = Fake::default();
        let mut l = ledger(&dir, &procs);
        procs.be(10, 100);
        assert!(l.reserve(&GPU0, 400 * MIB, 512 * MIB).unwrap());
        procs.be(11, 110);
        assert!(!l.reserve(&GPU0, 200 * MIB, 512 * MIB).unwrap());
        procs.kill(10);
        assert!(l.reserve(&GPU0, 200 * MIB, 512 * MIB).unwrap());
        // pid 11 reused by a younger process: the old share goes.
        procs.kill(11);
        procs.be(11, 999);
        assert_eq!(l.used(&GPU0).unwrap(), 0);
    }

    #[test]
    fn a_torn_record_is_reclaimed_and_a_file_of_garbage_is_survived() {
        let dir = tempfile::tempdir().unwrap();
        let procs = Fake::default();
        let mut l = ledger(&dir, &procs);
        procs.be(10, 100);
        assert!(l.reserve(&GPU0, 400 * MIB, 512 * MIB).unwrap());
        // Tear the record: flip a byte of its `used` field.
        let path = dir.path().join("usage");
        let mut raw = std::fs::read(&path).unwrap();
        raw[33] ^= 0xff;
        raw.extend_from_slice(&[7u8; 30]); // and a partial trailing write
        std::fs::write(&path, raw).unwrap();
        procs.be(11, 110);
        assert!(l.reserve(&GPU0, 500 * MIB, 512 * MIB).unwrap());
        assert_eq!(l.used(&GPU0).unwrap(), 500 * MIB);
    }

    #[test]
    fn process_records_keep_host_pids_and_throttled_time_past_their_process() {
        let dir = tempfile::tempdir().unwrap();
        let procs = Fake::default();
        let mut l = ledger(&dir, &procs);
        procs.be(10, 100);
        l.set_host_pid(5010).unwrap();
        l.add_throttled(300).unwrap();
        procs.be(11, 110);
        l.set_host_pid(5011).unwrap();
        l.add_throttled(40).unwrap();
        // A charge is taken past the limit; a reservation is not.
        l.rebase(&GPU0, 0, 600 * MIB).unwrap();
        assert!(!l.reserve(&GPU0, MIB, 512 * MIB).unwrap());
        assert_eq!(
            l.used(&GPU0).unwrap(),
            600 * MIB,
            "process records hold no memory"
        );
        let mut pids = l.host_pids().unwrap();
        pids.sort();
        assert_eq!(pids, [5010, 5011]);
        procs.kill(10);
        assert_eq!(l.host_pids().unwrap(), [5011]);
        let throttled = |dir: &tempfile::TempDir| -> u64 {
            std::fs::read(dir.path().join("usage"))
                .unwrap()
                .chunks(RECORD)
                .filter_map(Record::decode)
                .map(|r| r.throttled_us)
                .sum()
        };
        assert_eq!(
            throttled(&dir),
            340,
            "the dead process's time moved to the totals"
        );
        procs.kill(11);
        procs.be(12, 120);
        assert_eq!(l.host_pids().unwrap(), Vec::<u32>::new());
        assert_eq!(throttled(&dir), 340);
        assert_eq!(l.used(&GPU0).unwrap(), 0);
    }

    #[test]
    fn proc_stat_is_parsed_after_the_command() {
        let line = "123 (a (weird) cmd) S 1 123 123 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 200";
        assert_eq!(parse_stat(line), Some(('S', 98765)));
        let me = Proc.me().unwrap();
        assert_eq!(me.0, std::process::id());
        assert!(Proc.alive(me.0, me.1));
        assert!(!Proc.alive(me.0, me.1 + 1));
    }

    #[test]
    fn two_real_processes_share_the_file() {
        // The real thing across fork: the child reserves, the parent sees it, the child exits
        // and its share is reclaimed.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage");
        let mut parent = Ledger::new(path.clone());
        assert_eq!(parent.used(&GPU0).unwrap(), 0);
        // The child reports on one pipe and waits for the other to close.
        let (report_r, report_w) = nix_pipe();
        let (wait_r, wait_w) = nix_pipe();
        // SAFETY: fork in a test; the child only does file I/O and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut child = Ledger::new(path.clone());
            let ok = child.reserve(&GPU0, 100 * MIB, 512 * MIB).unwrap_or(false);
            // SAFETY: plain descriptor I/O on the pipes made above.
            unsafe {
                libc::close(wait_w);
                libc::write(report_w, [ok as u8].as_ptr().cast(), 1);
                let mut b = [0u8; 1];
                libc::read(wait_r, b.as_mut_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let mut b = [0u8; 1];
        // SAFETY: read the byte the child wrote.
        unsafe {
            libc::close(report_w);
            libc::close(wait_r);
            libc::read(report_r, b.as_mut_ptr().cast(), 1);
        }
        assert_eq!(b[0], 1);
        assert_eq!(parent.used(&GPU0).unwrap(), 100 * MIB);
        // SAFETY: closing the wait pipe lets the child exit; waitpid reaps it.
        unsafe {
            libc::close(wait_w);
            libc::close(report_r);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_eq!(parent.used(&GPU0).unwrap(), 0);
    }

    fn nix_pipe() -> (i32, i32) {
        let mut fds = [0i32; 2];
        // SAFETY: pipe fills two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    }
}
