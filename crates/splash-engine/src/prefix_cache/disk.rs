//! The prefix cache's disk tier: entries evicted from memory are written to files and read
//! back on a hit instead of prefilling the prefix again. One file per entry:
//!
//! | field | content |
//! |---|---|
//! | magic | `SPLCACHE` |
//! | u64 | format version (1) |
//! | bytes | identity: which model, weights and formats wrote the file |
//! | u64 | 1 when a draft context follows the state, else 0 |
//! | u64, u32 × n | the prompt prefix |
//! | bytes | the target state image |
//! | bytes | the draft context image (empty without a draft) |
//! | u32 | CRC-32 of everything before it |
//!
//! (`bytes`: a u64 length, then the bytes; little endian throughout.) A file that is
//! truncated, fails its checksum or was written under another identity is deleted and its
//! prefix recomputed, never used. Files are written by a background thread (a spill must not
//! stall the decoding streams) to a temporary name and renamed into place. Without
//! `persistent` they live in a directory of this process, removed at exit, or by the next
//! start when a process died without cleaning up.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use super::trie::TokenTrie;

const MAGIC: &[u8; 8] = b"SPLCACHE";
const VERSION: u64 = 1;
const EXTENSION: &str = "splc";
/// Host memory the writer's queue may hold; spills past it are dropped (the state is
/// recomputed if it is needed again).
const MAX_PENDING_BYTES: u64 = 4 << 30;

/// Where and how large the disk tier is.
#[derive(Clone, Debug)]
pub struct DiskCacheConfig {
    /// The directory under which each model identity gets its own directory.
    pub root: PathBuf,
    /// Bytes of files kept at most (least recently used files go first).
    pub budget_bytes: u64,
    /// Keep the files across restarts.
    pub persistent: bool,
    /// Names the model, its weights and the state formats; files written under another
    /// identity are refused.
    pub identity: String,
}

/// Bytes free to this user on the file system holding `path` (`None` when unknown).
pub fn free_disk_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = path;
    // The directory may not exist yet: ask about its nearest existing parent.
    while !p.exists() {
        p = p.parent()?;
    }
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// An entry written to disk.
struct DiskEntry {
    tokens: Vec<u32>,
    with_draft: bool,
    path: PathBuf,
    bytes: u64,
    last_used: u64,
}

#[derive(Default)]
struct Index {
    entries: Vec<DiskEntry>,
    /// The entries' tokens in a radix tree: how many files hold each sequence without and with
    /// a draft context (a lookup walks the prompt once, however many files there are).
    by_tokens: TokenTrie<[u32; 2]>,
    /// Spills queued for the writer (tokens, with a draft context) and their bytes: they count
    /// as present, and bound the host memory the queue holds.
    pending: Vec<(Vec<u32>, bool)>,
    pending_bytes: u64,
    bytes: u64,
    clock: u64,
    writes: u64,
    evictions: u64,
    errors: u64,
}

impl Index {
    fn add(&mut self, e: DiskEntry) {
        let mut counts = self.by_tokens.get(&e.tokens).unwrap_or([0, 0]);
        counts[e.with_draft as usize] += 1;
        self.by_tokens.insert(&e.tokens, counts);
        self.bytes += e.bytes;
        self.entries.push(e);
    }

    fn remove(&mut self, i: usize) {
        let e = self.entries.swap_remove(i);
        self.bytes -= e.bytes;
        if let Some(mut counts) = self.by_tokens.get(&e.tokens) {
            counts[e.with_draft as usize] -= 1;
            if counts == [0, 0] {
                self.by_tokens.remove(&e.tokens);
            } else {
                self.by_tokens.insert(&e.tokens, counts);
            }
        }
        let _ = fs::remove_file(&e.path);
    }

    /// Whether a file holds exactly `tokens`, with a draft context when `with_draft`.
    fn holds(&self, tokens: &[u32], with_draft: bool) -> bool {
        self.by_tokens
            .get(tokens)
            .is_some_and(|[plain, drafted]| drafted > 0 || (!with_draft && plain > 0))
    }

    /// Removes least recently used files until `extra` more bytes fit in `budget`.
    fn make_room(&mut self, extra: u64, budget: u64) {
        while self.bytes + extra > budget && !self.entries.is_empty() {
            let (i, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .expect("not empty");
            self.remove(i);
            self.evictions += 1;
        }
    }
}

/// Disk-tier counters for `/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCacheStats {
    pub entries: usize,
    pub bytes: u64,
    pub budget_bytes: u64,
    pub writes: u64,
    pub evictions: u64,
    /// Files found damaged or foreign and deleted.
    pub errors: u64,
}

/// A state to write.
pub(crate) struct Spill {
    pub tokens: Vec<u32>,
    pub state: Vec<u8>,
    pub draft: Option<Vec<u8>>,
}

/// Work for the writer thread.
enum Job {
    Write(Spill),
    /// Answered once everything queued before it is written.
    Flush(mpsc::Sender<()>),
}

/// An entry read back (checksum and identity verified).
pub(crate) struct Loaded {
    pub state: Vec<u8>,
    pub draft: Option<Vec<u8>>,
}

/// The tier: an index of the files and the thread that writes them.
pub(crate) struct DiskTier {
    dir: PathBuf,
    identity: Arc<[u8]>,
    budget: u64,
    persistent: bool,
    index: Arc<Mutex<Index>>,
    writer: Option<(mpsc::Sender<Job>, JoinHandle<()>)>,
    /// An exclusive lock on the directory while this tier uses it.
    _lock: fs::File,
}

/// FNV-1a: a stable 64-bit name for an identity or a token prefix.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// True while a process with this id runs.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

impl DiskTier {
    /// Opens (persistent: indexes the files already there, deleting damaged or foreign ones)
    /// or creates the tier's directory.
    pub(crate) fn open(cfg: DiskCacheConfig) -> io::Result<Self> {
        let model_dir = cfg
            .root
            .join(format!("{:016x}", fnv64(cfg.identity.as_bytes())));
        fs::create_dir_all(&model_dir)?;
        let _ = fs::write(model_dir.join("identity.txt"), &cfg.identity);
        let dir = if cfg.persistent {
            model_dir.join("persistent")
        } else {
            remove_stale_runs(&model_dir);
            // Unique within the process too (several engines, tests); a directory left by an
            // earlier process with the same id (a container's PID 1) is not ours.
            static TIERS: AtomicUsize = AtomicUsize::new(0);
            let n = TIERS.fetch_add(1, Ordering::Relaxed);
            let dir = model_dir.join(format!("run-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            dir
        };
        fs::create_dir_all(&dir)?;
        let lock = lock_dir(&dir)?;
        let identity: Arc<[u8]> = cfg.identity.as_bytes().into();
        let mut index = Index::default();
        if cfg.persistent {
            index = scan(&dir, &identity);
            index.make_room(0, cfg.budget_bytes);
        }
        let index = Arc::new(Mutex::new(index));
        let (tx, rx) = mpsc::channel::<Job>();
        let worker = {
            let (dir, identity, index) = (dir.clone(), identity.clone(), index.clone());
            let budget = cfg.budget_bytes;
            std::thread::Builder::new()
                .name("splash-cache-disk".into())
                .spawn(move || {
                    for job in rx {
                        match job {
                            Job::Write(spill) => {
                                write_entry(&dir, &identity, &index, budget, spill)
                            }
                            Job::Flush(done) => drop(done.send(())),
                        }
                    }
                })?
        };
        Ok(Self {
            dir,
            identity,
            budget: cfg.budget_bytes,
            persistent: cfg.persistent,
            index,
            writer: Some((tx, worker)),
            _lock: lock,
        })
    }

    /// The directory holding the files.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// True when the files outlive the process.
    pub(crate) fn persistent(&self) -> bool {
        self.persistent
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when a file for exactly these tokens (with a draft context if `with_draft`) is
    /// on disk or being written.
    pub(crate) fn contains(&self, tokens: &[u32], with_draft: bool) -> bool {
        let index = self.index();
        index.holds(tokens, with_draft)
            || index
                .pending
                .iter()
                .any(|(t, d)| t == tokens && *d >= with_draft)
    }

    /// True while a spill of exactly these tokens waits for the writer.
    pub(crate) fn is_pending(&self, tokens: &[u32], with_draft: bool) -> bool {
        self.index()
            .pending
            .iter()
            .any(|(t, d)| t == tokens && *d >= with_draft)
    }

    /// The length of the longest proper prefix of `prompt` on disk.
    pub(crate) fn best(&self, prompt: &[u32], with_draft: bool) -> Option<usize> {
        self.index()
            .by_tokens
            .prefixes(prompt)
            .into_iter()
            .filter(|&(len, [plain, drafted])| {
                len < prompt.len() && (drafted > 0 || (!with_draft && plain > 0))
            })
            .map(|(len, _)| len)
            .next_back()
    }

    /// Reads the entry for `prompt[..len]`. A damaged file is deleted and counted; the
    /// error says why.
    pub(crate) fn read(
        &self,
        prompt: &[u32],
        len: usize,
        with_draft: bool,
    ) -> Result<Loaded, String> {
        let path = {
            let mut index = self.index();
            index.clock += 1;
            let clock = index.clock;
            let e = index
                .entries
                .iter_mut()
                .find(|e| e.tokens[..] == prompt[..len] && (e.with_draft || !with_draft))
                .ok_or("the entry was evicted")?;
            e.last_used = clock;
            e.path.clone()
        };
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            // Evicted by the writer meanwhile: a miss, not damage.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(format!("{}: evicted", path.display()))
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        match parse(&bytes, &self.identity, Some(&prompt[..len])) {
            Ok((_, loaded)) => Ok(loaded),
            Err(e) => {
                self.discard(&path);
                Err(format!("{}: {e}", path.display()))
            }
        }
    }

    /// Deletes a file whose content could not be used.
    pub(crate) fn discard(&self, path: &Path) {
        let mut index = self.index();
        index.errors += 1;
        if let Some(i) = index.entries.iter().position(|e| e.path == path) {
            index.remove(i);
        }
    }

    /// Deletes the entry for `tokens` (with a draft context or not) after its image was
    /// refused by the model.
    pub(crate) fn discard_tokens(&self, tokens: &[u32], with_draft: bool) {
        let path = self
            .index()
            .entries
            .iter()
            .find(|e| e.tokens == tokens && e.with_draft == with_draft)
            .map(|e| e.path.clone());
        if let Some(p) = path {
            self.discard(&p);
        }
    }

    /// Queues `spill` for writing (the engine does not wait). Dropped when the queue already
    /// holds too much.
    pub(crate) fn spill(&self, spill: Spill) {
        let Some((tx, _)) = &self.writer else {
            return;
        };
        let size = spill_bytes(&spill);
        {
            let mut index = self.index();
            if index.pending_bytes + size > MAX_PENDING_BYTES {
                tracing::warn!("prefix cache: the disk writer is behind; a state is not saved");
                return;
            }
            index.pending_bytes += size;
            index
                .pending
                .push((spill.tokens.clone(), spill.draft.is_some()));
        }
        let _ = tx.send(Job::Write(spill));
    }

    /// Waits until every queued spill is written.
    pub(crate) fn flush(&self) {
        if let Some((tx, _)) = &self.writer {
            let (done, wait) = mpsc::channel();
            if tx.send(Job::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    pub(crate) fn stats(&self) -> DiskCacheStats {
        let index = self.index();
        DiskCacheStats {
            entries: index.entries.len(),
            bytes: index.bytes,
            budget_bytes: self.budget,
            writes: index.writes,
            evictions: index.evictions,
            errors: index.errors,
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        if let Some((tx, worker)) = self.writer.take() {
            drop(tx);
            let _ = worker.join();
        }
        if !self.persistent {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Removes the run directories of processes that no longer exist.
fn remove_stale_runs(model_dir: &Path) {
    let Ok(entries) = fs::read_dir(model_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("run-"))
            .and_then(|p| p.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if pid as u32 != std::process::id() && !alive(pid) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The file bytes of an entry.
fn encode(identity: &[u8], spill: &Spill) -> Vec<u8> {
    let draft = spill.draft.as_deref().unwrap_or(&[]);
    let mut out = Vec::with_capacity(64 + spill.tokens.len() * 4 + spill.state.len() + draft.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let bytes = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    };
    bytes(&mut out, identity);
    out.extend_from_slice(&(spill.draft.is_some() as u64).to_le_bytes());
    out.extend_from_slice(&(spill.tokens.len() as u64).to_le_bytes());
    out.extend_from_slice(&token_bytes(&spill.tokens));
    bytes(&mut out, &spill.state);
    bytes(&mut out, draft);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A reader over a file's fields; every error names the field.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let (head, rest) = self
            .0
            .split_at_checked(n)
            .ok_or_else(|| format!("truncated in {what}"))?;
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).map_err(|_| format!("{what} is too long"))?;
        self.take(n, what)
    }
}

/// A reader over a file's fields that knows how many bytes the file has left: a length read
/// from disk is checked against them before anything is allocated for it (a damaged length
/// must not ask for terabytes).
struct Bounded<R> {
    r: R,
    left: u64,
}

impl<R: Read> Bounded<R> {
    fn take(&mut self, n: u64, what: &str) -> Result<Vec<u8>, String> {
        if n > self.left {
            return Err(format!(
                "{what}: {n} bytes claimed, the file has {} left",
                self.left
            ));
        }
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|_| format!("truncated in {what}"))?;
        self.left -= n;
        Ok(b)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
}

impl<R: Read + io::Seek> Bounded<io::BufReader<R>> {
    /// Checks that the state and draft lengths after the header add up to the file's size,
    /// without reading the images.
    fn check_body(&mut self) -> Result<(), String> {
        let state = self.u64("the state image length")?;
        // The draft length and the checksum follow the state image.
        if state > self.left.saturating_sub(12) {
            return Err(format!(
                "the state image: {state} bytes claimed, the file has {} left",
                self.left
            ));
        }
        self.r
            .seek_relative(state as i64)
            .map_err(|e| e.to_string())?;
        self.left -= state;
        let draft = self.u64("the draft image length")?;
        if draft.checked_add(4) != Some(self.left) {
            return Err(format!(
                "the draft image: {draft} bytes claimed, the file has {} left",
                self.left
            ));
        }
        Ok(())
    }
}

/// The header of an entry, read field by field (only its bytes, not the state): identity check,
/// draft flag and tokens.
fn read_header(r: &mut Bounded<impl Read>, identity: &[u8]) -> Result<(bool, Vec<u32>), String> {
    if r.u64("the magic")?.to_le_bytes() != *MAGIC {
        return Err("not a splash cache file".into());
    }
    let version = r.u64("the version")?;
    if version != VERSION {
        return Err(format!(
            "format version {version}, this splash reads {VERSION}"
        ));
    }
    let foreign = || "written for another model or format".to_string();
    if r.u64("the identity")? != identity.len() as u64
        || r.take(identity.len() as u64, "the identity")? != identity
    {
        return Err(foreign());
    }
    let with_draft = r.u64("the draft flag")? != 0;
    let n = r.u64("the token count")?;
    let raw = r.take(
        n.checked_mul(4).ok_or("the token count is damaged")?,
        "the tokens",
    )?;
    let tokens = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok((with_draft, tokens))
}

/// An exclusive lock on `dir` (a `lock` file in it): two processes must not share one tier.
fn lock_dir(dir: &Path) -> io::Result<fs::File> {
    use std::os::unix::io::AsRawFd;
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    // SAFETY: a valid open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::other(format!(
            "{} is in use by another splash process",
            dir.display()
        )));
    }
    Ok(file)
}

/// Checks and splits a whole file (`tokens`: the prefix it must hold).
fn parse(
    bytes: &[u8],
    identity: &[u8],
    tokens: Option<&[u32]>,
) -> Result<(Vec<u32>, Loaded), String> {
    let (body, crc) = bytes
        .split_at_checked(bytes.len().wrapping_sub(4))
        .filter(|_| bytes.len() >= 4)
        .ok_or("truncated")?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err("checksum mismatch (the file is damaged)".into());
    }
    let mut rest = body;
    let (with_draft, found) = read_header(
        &mut Bounded {
            r: &mut rest,
            left: body.len() as u64,
        },
        identity,
    )?;
    let mut f = Fields(rest);
    if tokens.is_some_and(|t| t != found) {
        return Err("holds another prefix".into());
    }
    let state = f.bytes("the state image")?.to_vec();
    let draft = f.bytes("the draft image")?;
    if !f.0.is_empty() {
        return Err("bytes past the end".into());
    }
    let draft = with_draft.then(|| draft.to_vec());
    Ok((found, Loaded { state, draft }))
}

/// Indexes the files of a persistent directory (oldest modified = least recently used),
/// deleting leftovers of interrupted writes and files that are not ours.
fn scan(dir: &Path, identity: &[u8]) -> Index {
    let mut found: Vec<(std::time::SystemTime, DiskEntry)> = Vec::new();
    let mut index = Index::default();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.file_name().is_some_and(|n| n == "lock") {
            continue;
        }
        if path.extension().and_then(|x| x.to_str()) != Some(EXTENSION) {
            let _ = fs::remove_file(&path);
            continue;
        }
        let head = (|| -> Result<_, String> {
            let file = fs::File::open(&path).map_err(|e| e.to_string())?;
            let bytes = file.metadata().map_err(|e| e.to_string())?.len();
            let mut r = Bounded {
                r: io::BufReader::new(file),
                left: bytes,
            };
            let (with_draft, tokens) = read_header(&mut r, identity)?;
            r.check_body()?;
            let modified = e
                .metadata()
                .and_then(|m| m.modified())
                .map_err(|e| e.to_string())?;
            Ok((modified, with_draft, tokens, bytes))
        })();
        match head {
            Ok((modified, with_draft, tokens, bytes)) => found.push((
                modified,
                DiskEntry {
                    tokens,
                    with_draft,
                    path,
                    bytes,
                    last_used: 0,
                },
            )),
            Err(why) => {
                tracing::warn!("prefix cache: deleting {}: {why}", path.display());
                index.errors += 1;
                let _ = fs::remove_file(&path);
            }
        }
    }
    found.sort_by_key(|(m, _)| *m);
    for (i, (_, mut e)) in found.into_iter().enumerate() {
        e.last_used = i as u64;
        index.add(e);
    }
    index.clock = index.entries.len() as u64;
    index
}

/// The bytes a spill holds in the writer's queue.
fn spill_bytes(spill: &Spill) -> u64 {
    (spill.tokens.len() * 4 + spill.state.len() + spill.draft.as_ref().map_or(0, Vec::len)) as u64
}

/// Writes one entry (temporary name, then rename) and indexes it within the budget. The index
/// is locked only to make room and to add the entry, not during the write: the engine reads it
/// at every step.
fn write_entry(dir: &Path, identity: &[u8], index: &Mutex<Index>, budget: u64, spill: Spill) {
    let lock = || index.lock().unwrap_or_else(|e| e.into_inner());
    let key = (spill.tokens.clone(), spill.draft.is_some());
    let queued = spill_bytes(&spill);
    let done = |index: &mut Index| {
        index.pending_bytes -= queued;
        if let Some(i) = index.pending.iter().position(|p| *p == key) {
            index.pending.swap_remove(i);
        }
    };
    let bytes = encode(identity, &spill);
    let size = bytes.len() as u64;
    let mut name = token_bytes(&spill.tokens);
    name.push(spill.draft.is_some() as u8);
    let path = dir.join(format!("{:016x}.{EXTENSION}", fnv64(&name)));
    let tmp = path.with_extension("tmp");
    if size > budget {
        done(&mut lock());
        return;
    }
    {
        // Room first: the budget bounds what is on disk, the new file included.
        let mut index = lock();
        if let Some(i) = index.entries.iter().position(|e| e.path == path) {
            index.remove(i);
        }
        index.make_room(size, budget);
    }
    let written = fs::write(&tmp, &bytes).and_then(|_| fs::rename(&tmp, &path));
    let mut index = lock();
    done(&mut index);
    if let Err(e) = written {
        tracing::warn!("prefix cache: cannot write {}: {e}", path.display());
        let _ = fs::remove_file(&tmp);
        return;
    }
    index.clock += 1;
    let last_used = index.clock;
    index.writes += 1;
    index.add(DiskEntry {
        tokens: spill.tokens,
        with_draft: spill.draft.is_some(),
        path,
        bytes: size,
        last_used,
    });
}

fn token_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(root: &Path, persistent: bool, budget: u64) -> DiskCacheConfig {
        DiskCacheConfig {
            root: root.to_path_buf(),
            budget_bytes: budget,
            persistent,
            identity: "model A".into(),
        }
    }

    fn spill(tokens: &[u32], size: usize) -> Spill {
        Spill {
            tokens: tokens.to_vec(),
            state: vec![7; size],
            draft: None,
        }
    }

    fn temp_root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("splash-disk-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        root
    }

    #[test]
    fn entries_round_trip_and_the_budget_evicts_the_least_recently_used() {
        let root = temp_root("budget");
        let tier = DiskTier::open(config(&root, false, 3_000)).unwrap();
        let dir = tier.dir().to_path_buf();
        tier.spill(spill(&[1, 2, 3], 1000));
        tier.spill(spill(&[1, 2, 3, 4, 5], 1000));
        tier.flush();
        assert_eq!(tier.best(&[1, 2, 3, 4, 5, 6], false), Some(5));
        assert_eq!(tier.best(&[1, 2, 3, 4], false), Some(3));
        assert_eq!(tier.best(&[1, 2, 3, 4], true), None, "no draft context");
        let got = tier.read(&[1, 2, 3, 4], 3, false).unwrap();
        assert_eq!(got.state, vec![7; 1000]);
        // [1,2,3] was just used: the third entry evicts [1,2,3,4,5].
        tier.spill(spill(&[9], 1000));
        tier.flush();
        assert_eq!(tier.best(&[1, 2, 3, 4, 5, 6], false), Some(3));
        assert_eq!(tier.best(&[9, 9], false), Some(1));
        assert_eq!(tier.stats().evictions, 1);
        assert!(tier.stats().bytes <= 3_000);
        drop(tier);
        assert!(!dir.exists(), "a non-persistent tier is removed at exit");
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn damaged_files_are_deleted_and_persistent_files_survive_a_restart() {
        let root = temp_root("persist");
        let tier = DiskTier::open(config(&root, true, 1 << 20)).unwrap();
        tier.spill(spill(&[4, 5], 100));
        tier.spill(spill(&[6, 7], 100));
        tier.flush();
        let dir = tier.dir().to_path_buf();
        drop(tier);
        // Damage one file: flip a byte of its state.
        let tier = DiskTier::open(config(&root, true, 1 << 20)).unwrap();
        assert_eq!(tier.stats().entries, 2, "kept across the restart");
        let e = DiskTier::open(config(&root, true, 1 << 20)).err().unwrap();
        assert!(e.to_string().contains("in use by another"), "{e}");
        let victim = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let b = fs::read(p).unwrap();
                parse(&b, b"model A", Some(&[4, 5])).is_ok()
            })
            .unwrap();
        let mut b = fs::read(&victim).unwrap();
        let n = b.len();
        b[n - 20] ^= 1;
        fs::write(&victim, &b).unwrap();
        let e = tier.read(&[4, 5, 1], 2, false).err().unwrap();
        assert!(e.contains("checksum"), "{e}");
        assert!(!victim.exists(), "the damaged file is deleted");
        assert_eq!(tier.stats().errors, 1);
        assert!(tier.read(&[6, 7, 1], 2, false).is_ok());
        drop(tier);
        // Another identity does not use (and deletes) nothing of model A's: its own directory.
        let other = DiskTier::open(DiskCacheConfig {
            identity: "model B".into(),
            ..config(&root, true, 1 << 20)
        })
        .unwrap();
        assert_eq!(other.stats().entries, 0);
        drop(other);
        // A truncated file is found at the next start and deleted.
        let survivor = fs::read_dir(&dir).unwrap().flatten().next().unwrap().path();
        let b = fs::read(&survivor).unwrap();
        fs::write(&survivor, &b[..20]).unwrap();
        let tier = DiskTier::open(config(&root, true, 1 << 20)).unwrap();
        assert_eq!(tier.stats().entries, 0);
        assert_eq!(tier.stats().errors, 1);
        assert!(!survivor.exists());
        drop(tier);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn damaged_lengths_are_refused_at_start_without_allocating_them() {
        let root = temp_root("lengths");
        let tier = DiskTier::open(config(&root, true, 1 << 20)).unwrap();
        let dir = tier.dir().to_path_buf();
        drop(tier);
        let id = b"model A".len();
        let tokens = [3u32, 1, 4];
        let good = encode(b"model A", &spill(&tokens, 100));
        // Field offsets: the token count, then the state and draft image lengths.
        let count_at = 32 + id;
        let state_at = count_at + 8 + tokens.len() * 4;
        let draft_at = state_at + 8 + 100;
        let set = |at: usize, v: u64| {
            let mut b = good.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            b
        };
        let damaged = [
            // Bit 40 of the token count (the field report): 4 TiB of tokens.
            set(count_at, 3 | 1 << 40),
            set(count_at, u64::MAX),
            set(count_at, 1000),
            set(state_at, 100 | 1 << 40),
            set(state_at, u64::MAX),
            set(draft_at, 1 << 50),
            set(draft_at, 5),
        ];
        for (i, b) in damaged.iter().enumerate() {
            fs::write(dir.join(format!("damaged{i}.{EXTENSION}")), b).unwrap();
        }
        fs::write(dir.join(format!("good.{EXTENSION}")), &good).unwrap();
        let tier = DiskTier::open(config(&root, true, 1 << 20)).unwrap();
        assert_eq!(tier.stats().entries, 1, "only the intact file is kept");
        assert_eq!(tier.stats().errors, damaged.len() as u64);
        for i in 0..damaged.len() {
            assert!(!dir.join(format!("damaged{i}.{EXTENSION}")).exists());
        }
        assert_eq!(tier.best(&[3, 1, 4, 1], false), Some(3));
        assert_eq!(
            tier.read(&[3, 1, 4, 1], 3, false).unwrap().state,
            vec![7; 100]
        );
        drop(tier);
        // A file read whole, with the damage under a valid checksum: refused, not allocated.
        let mut b = set(count_at, 3 | 1 << 40);
        let n = b.len();
        let crc = crc32fast::hash(&b[..n - 4]);
        b[n - 4..].copy_from_slice(&crc.to_le_bytes());
        let e = parse(&b, b"model A", None).err().unwrap();
        assert!(e.contains("the tokens"), "{e}");
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_file_under_another_identity_is_refused() {
        let s = spill(&[1], 10);
        let bytes = encode(b"model A", &s);
        assert!(parse(&bytes, b"model A", Some(&[1])).is_ok());
        let e = parse(&bytes, b"model B", Some(&[1])).err().unwrap();
        assert!(e.contains("another model"), "{e}");
        let e = parse(&bytes, b"model A", Some(&[2])).err().unwrap();
        assert!(e.contains("another prefix"), "{e}");
        let e = parse(&bytes[..bytes.len() - 1], b"model A", None)
            .err()
            .unwrap();
        assert!(e.contains("checksum"), "{e}");
    }
}
