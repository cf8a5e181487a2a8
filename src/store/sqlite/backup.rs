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
    let Some(target) = to.to_str() else {
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
                format!("cannot be opened: {}", crate::store::driver::message(&e)),
            )
        })?;
    let copied = sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
    if let Err(e) = copied {
        let error = Error::from(e);
        // Half a copy is no backup.
        let _ = std::fs::remove_file(to);
        let problem = match error.fault() {
            Some(Fault::Full) => format!("cannot be written, the disk is full ({error})"),
            _ => format!("cannot be written: {error}"),
        };
        return Err(check::unusable(to, problem));
    }
    Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
}
