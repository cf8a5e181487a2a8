//! Online backup of a SQLite database: `VACUUM INTO` a new file through a read-only
//! connection, which copies one consistent snapshot (WAL lets writers go on meanwhile) into a
//! compact file that `ctxd serve --db` opens as it is.

use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use super::check;
use crate::store::{Error, Fault, Result};

/// Copies the database at `db` into the new file `to` and returns its size. Refuses an existing
/// `to`; a copy that fails (a full disk) leaves no file behind, and never touches `db`.
pub(in crate::store) async fn copy(db: &Path, to: &Path) -> Result<u64> {
    if !db.is_file() {
        return Err(check::unusable(db, "does not exist".into()));
    }
    if to.exists() {
        return Err(check::unusable(
            to,
            "exists: a backup writes a new file".into(),
        ));
    }
    // Written under another name and renamed once complete and on disk: a backup cut short
    // (a full disk, a kill) never leaves a file under the name asked for.
    let partial = {
        let mut name = to.as_os_str().to_owned();
        name.push(".partial");
        std::path::PathBuf::from(name)
    };
    let _ = std::fs::remove_file(&partial);
    let Some(target) = partial.to_str() else {
        return Err(check::unusable(to, "is not a UTF-8 path".into()));
    };
    let mut conn = SqliteConnectOptions::new()
        .filename(db)
        .read_only(true)
        .connect()
        .await
        .map_err(|e| {
            check::unusable(
                db,
                format!(
                    "cannot be opened: {}",
                    crate::store::sql::driver::message(&e)
                ),
            )
        })?;
    let copied = sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
    let copied = copied.map_err(Error::from).and_then(|_| {
        publish(&partial, to).map_err(|e| Error::Database {
            fault: if e.raw_os_error() == Some(28) {
                Fault::Full
            } else {
                Fault::Unavailable
            },
            detail: e.to_string(),
        })
    });
    if let Err(error) = copied {
        // Half a copy is no backup.
        let _ = std::fs::remove_file(&partial);
        if error.fault() == Some(Fault::Full) {
            return Err(Error::Database {
                fault: Fault::Full,
                detail: format!(
                    "{}: cannot be written, the disk is full ({error}); nothing was left there",
                    to.display()
                ),
            });
        }
        return Err(check::unusable(to, format!("cannot be written: {error}")));
    }
    Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
}

/// Syncs the finished copy, renames it to `to` (refusing to replace a file that appeared
/// meanwhile) and syncs the directory, so the rename survives a power cut.
fn publish(partial: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::File::open(partial)?.sync_all()?;
    std::fs::hard_link(partial, to)?;
    std::fs::remove_file(partial)?;
    if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
