//! Start-up checks of the database file and its WAL, made before SQLite opens them: SQLite would
//! silently initialise an empty file, discard a WAL whose header it cannot read, or fail later
//! with a vague message. A file that fails here is refused and left exactly as it was.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::Error;

/// The 16 bytes every SQLite database starts with.
const MAGIC: &[u8; 16] = b"SQLite format 3\0";
const HEADER_BYTES: usize = 100;
const WAL_HEADER_BYTES: usize = 32;
/// The WAL magic numbers: the low bit says whether checksums are big-endian.
const WAL_MAGIC: [u32; 2] = [0x377f_0682, 0x377f_0683];
/// The only WAL format version SQLite writes.
const WAL_VERSION: u32 = 3_007_000;

/// What the checks found at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// No file yet: SQLite creates it (the first start).
    Nothing,
    /// A database whose header, size and WAL are sound.
    Database {
        /// Whether a `-wal` file exists beside it (then a read must go through the WAL).
        wal: bool,
    },
}

/// Checks `path` and its `-wal` without writing to either.
pub(super) fn before_open(path: &Path) -> Result<Found, Error> {
    let bad = |problem: String| unusable(path, problem);
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map_or_else(
        || "the database".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(unusable(&dir, "is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(unusable(&dir, "directory does not exist".into()));
        }
        Err(e) => return Err(unusable(&dir, format!("directory cannot be used: {e}"))),
    }
    // WAL mode creates `-wal` and `-shm` beside the database, so a directory ctxd cannot write
    // to fails even with a writable file (and SQLite would only say "unable to open").
    if let Err(reason) = writable(&dir, true) {
        return Err(unusable(
            &dir,
            format!(
                "directory is {reason}: the database needs {name}-wal and {name}-shm beside it"
            ),
        ));
    }
    let wal_path = wal_path(path);
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(&wal_path).is_ok() {
                return Err(unusable(
                    &wal_path,
                    format!(
                        "a WAL without its database {}: restore the database or move the WAL away",
                        path.display()
                    ),
                ));
            }
            return Ok(Found::Nothing);
        }
        Err(e) => return Err(bad(format!("cannot be read: {e}"))),
    };
    if !meta.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    if let Err(reason) = writable(path, false) {
        return Err(bad(format!("is {reason}")));
    }
    let size = meta.len();
    if size == 0 {
        return Err(bad(
            "is empty (0 bytes), not a ctxd database; remove it to start a new one".into(),
        ));
    }
    let header =
        read_prefix(path, HEADER_BYTES).map_err(|e| bad(format!("cannot be read: {e}")))?;
    if header.iter().all(|&b| b == 0) {
        return Err(bad("not a SQLite database (its header is zeroed)".into()));
    }
    let magic_len = header.len().min(MAGIC.len());
    if header[..magic_len] != MAGIC[..magic_len] {
        return Err(bad("not a SQLite database (bad header)".into()));
    }
    if header.len() < HEADER_BYTES {
        return Err(bad(format!(
            "truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte SQLite header"
        )));
    }
    let page = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n if n >= 512 && n.is_power_of_two() => u64::from(n),
        n => {
            return Err(bad(format!(
                "not a SQLite database (bad header: page size {n})"
            )));
        }
    };
    // The payload fractions are fixed by the file format; anything else is not SQLite's.
    if header[21..24] != [64, 32, 32] {
        return Err(bad(
            "not a SQLite database (bad header: payload fractions)".into()
        ));
    }
    if !size.is_multiple_of(page) {
        return Err(bad(format!(
            "truncated: {size} bytes is not a whole number of {page}-byte pages"
        )));
    }

    let wal = match std::fs::metadata(&wal_path) {
        Ok(meta) => Some(meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(unusable(&wal_path, format!("cannot be read: {e}"))),
    };
    let wal_frames = match &wal {
        None => false,
        Some(meta) => check_wal(&wal_path, meta, page)?,
    };
    // The page count in the header is valid only when the change counter matches the
    // version-valid-for field. A WAL with frames may legitimately hold the rest of the file (a
    // checkpoint cut short), so only a database without one must be as long as it says.
    let be32 = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let pages = u64::from(be32(28));
    if pages > 0 && be32(24) == be32(92) && !wal_frames && pages * page > size {
        return Err(bad(format!(
            "truncated: {size} bytes, but its header counts {pages} pages of {page} bytes ({} bytes)",
            pages * page
        )));
    }
    Ok(Found::Database { wal: wal.is_some() })
}

/// Checks a `-wal` file's header; returns whether it holds frames after it.
fn check_wal(wal_path: &Path, meta: &std::fs::Metadata, page: u64) -> Result<bool, Error> {
    let bad = |problem: String| unusable(wal_path, problem);
    if !meta.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    // A WAL removed while it is checked was checkpointed and removed by the last connection of
    // a process closing the database (a restart's old server, say): there is nothing to check.
    let vanished = || {
        std::fs::symlink_metadata(wal_path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    };
    if let Err(reason) = writable(wal_path, false) {
        return if vanished() {
            Ok(false)
        } else {
            Err(bad(format!("is {reason}")))
        };
    }
    let size = meta.len();
    // SQLite truncates or resets a WAL after a checkpoint: empty is normal.
    if size == 0 {
        return Ok(false);
    }
    let header = match read_prefix(wal_path, WAL_HEADER_BYTES) {
        Ok(header) => header,
        Err(_) if vanished() => return Ok(false),
        Err(e) => return Err(bad(format!("cannot be read: {e}"))),
    };
    if header.is_empty() {
        // Emptied (truncated by a checkpoint) since it was measured.
        return Ok(false);
    }
    if header.len() < WAL_HEADER_BYTES {
        return Err(bad(format!(
            "not a SQLite WAL (truncated header: {size} bytes of {WAL_HEADER_BYTES})"
        )));
    }
    let word = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let magic = word(0);
    if !WAL_MAGIC.contains(&magic) {
        return Err(bad("not a SQLite WAL (bad header)".into()));
    }
    if word(4) != WAL_VERSION {
        return Err(bad(format!(
            "not a SQLite WAL (unknown version {})",
            word(4)
        )));
    }
    if u64::from(word(8)) != page {
        return Err(bad(format!(
            "not this database's WAL (its pages are {} bytes, the database's {page})",
            word(8)
        )));
    }
    let (s0, s1) = wal_checksum(&header[..24], magic & 1 == 1);
    if (s0, s1) != (word(24), word(28)) {
        return Err(bad("not a SQLite WAL (bad header checksum)".into()));
    }
    Ok(size > WAL_HEADER_BYTES as u64)
}

/// SQLite's WAL checksum (section 4.3 of its file format document) over `data`, read as 32-bit
/// words in big- or little-endian order.
fn wal_checksum(data: &[u8], big_endian: bool) -> (u32, u32) {
    let (mut s0, mut s1) = (0u32, 0u32);
    for pair in data.chunks_exact(8) {
        let word = |b: &[u8]| {
            let b = [b[0], b[1], b[2], b[3]];
            if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        s0 = s0.wrapping_add(word(&pair[..4])).wrapping_add(s1);
        s1 = s1.wrapping_add(word(&pair[4..])).wrapping_add(s0);
    }
    (s0, s1)
}

/// Runs `PRAGMA quick_check` on an existing database through a read-only connection, before
/// anything writes to it. Without a `-wal` the file is opened immutable, so not even a `-wal`
/// or `-shm` is created for a file that is then refused.
pub(super) async fn quick_check(path: &Path, wal: bool) -> Result<(), Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .immutable(!wal);
    let failed = |detail: String| unusable(path, format!("fails PRAGMA quick_check: {detail}"));
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|e| {
            unusable(
                path,
                format!(
                    "cannot be opened: {}",
                    crate::store::sql::driver::message(&e)
                ),
            )
        })?;
    let rows: Result<Vec<String>, sqlx::Error> = sqlx::query_scalar("PRAGMA quick_check")
        .fetch_all(&pool)
        .await;
    pool.close().await;
    match rows {
        Ok(rows) if rows.len() == 1 && rows[0] == "ok" => Ok(()),
        Ok(rows) => Err(failed(format!(
            "{} ({} problem{})",
            rows.first().map_or("no answer", String::as_str),
            rows.len(),
            if rows.len() == 1 { "" } else { "s" }
        ))),
        Err(e) => Err(failed(crate::store::sql::driver::message(&e))),
    }
}

pub(super) fn unusable(path: &Path, problem: String) -> Error {
    Error::Unusable {
        path: path.to_path_buf(),
        problem,
    }
}

pub(super) fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// The first `n` bytes of a file (fewer if it is shorter), read without writing.
fn read_prefix(path: &Path, n: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(n);
    File::open(path)?.take(n as u64).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether ctxd may write `path`; `Err` says why not ("read-only", "not writable: …").
///
/// The permission bits are checked as well as the OS's answer: the superuser may write through
/// them, but a database marked read-only was marked so for a reason.
fn writable(path: &Path, dir: bool) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("not accessible: {e}"))?;
    if meta.permissions().readonly() {
        return Err("read-only (no write permission)".into());
    }
    #[cfg(unix)]
    {
        use rustix::fs::{Access, access};
        let wanted = if dir {
            Access::WRITE_OK | Access::EXEC_OK
        } else {
            Access::READ_OK | Access::WRITE_OK
        };
        access(path, wanted).map_err(|e| format!("not writable ({})", std::io::Error::from(e)))?;
    }
    #[cfg(not(unix))]
    if !dir {
        // Opening for writing without writing changes neither the bytes nor the mtime.
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("not writable ({e})"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wal_removed_while_it_is_checked_counts_as_none() {
        // The old server of a restart may checkpoint and remove its WAL between our looking and
        // our checking it.
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("ctxd.db-wal");
        std::fs::write(&wal, [0u8; 64]).unwrap();
        let meta = std::fs::metadata(&wal).unwrap();
        std::fs::remove_file(&wal).unwrap();
        assert!(!check_wal(&wal, &meta, 4096).unwrap());
    }

    #[test]
    fn the_wal_checksum_matches_a_header_sqlite_wrote() {
        // The WAL header of a database SQLite 3 wrote (little-endian checksums, 4096-byte pages).
        let header: [u8; 32] = [
            0x37, 0x7f, 0x06, 0x82, 0x00, 0x2d, 0xe2, 0x18, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x42, 0x64, 0x67, 0x87, 0x81, 0x50, 0x8e, 0x21, 0x5c, 0x4e, 0x67, 0x55,
            0x35, 0xc4, 0x8f, 0x7b,
        ];
        let stored = (
            u32::from_be_bytes([header[24], header[25], header[26], header[27]]),
            u32::from_be_bytes([header[28], header[29], header[30], header[31]]),
        );
        assert_eq!(wal_checksum(&header[..24], false), stored);
        assert_ne!(wal_checksum(&header[..24], true), stored);
    }
}
