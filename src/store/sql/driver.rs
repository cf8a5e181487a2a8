//! sqlx's errors as the store's: sqlx serves both engines, so a database error is classified
//! by the engine that answered (`store::sqlite::fault`, `store::postgres::fault`), and only its
//! message is kept, in the engine's own words.

use super::{Error, Fault};
use crate::store::{postgres, sqlite};

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::Database {
            fault: sqlx_fault(&error),
            detail: message(&error),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        use sqlx::migrate::MigrateError::{Execute, ExecuteMigration};
        match &error {
            Execute(e) | ExecuteMigration(e, _) => Error::Migrate {
                fault: sqlx_fault(e),
                detail: message(e),
            },
            _ => Error::Migrate {
                fault: Fault::Internal,
                detail: error.to_string(),
            },
        }
    }
}

/// sqlx serves both backends: a database error is classified by the engine that answered.
fn sqlx_fault(error: &sqlx::Error) -> Fault {
    match error {
        sqlx::Error::Database(db) => {
            match db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                Some(pg) => postgres::classify(pg.code()),
                None => sqlite::fault::code_fault(db.code().and_then(|c| c.parse::<i32>().ok())),
            }
        }
        // The one writer connection stayed taken past the acquire timeout: writes are queued
        // behind a lock another process holds.
        sqlx::Error::PoolTimedOut => Fault::Busy,
        sqlx::Error::PoolClosed => Fault::Closed,
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed | sqlx::Error::Protocol(_) => {
            Fault::Unavailable
        }
        _ => Fault::Internal,
    }
}

/// The database's own words for a failure, without sqlx's wrapping.
pub(in crate::store) fn message(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}
