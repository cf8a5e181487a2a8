//! Minting ids: each a UUID v7 from the clock, so ids sort by creation time. Here, not in
//! `domain`, for the engine reads no clock.

use uuid::Uuid;

use crate::domain::{CompactionId, GatewayCallId, NodeId, SessionId, SummaryId};

macro_rules! mint {
    ($($name:ident),*) => {$(
        impl $name {
            /// A new id, from the clock now.
            pub fn new() -> Self {
                Self::from_uuid(Uuid::now_v7())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    )*};
}

mint!(SessionId, NodeId, SummaryId, CompactionId, GatewayCallId);
