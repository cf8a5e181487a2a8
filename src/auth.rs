//! Who a caller is, for every way in: the API keys file (keys kept as hashes, each for a
//! tenant, some for admins), the tenants' retention settings, and the tenant a request's
//! headers name, with the refusal that says why not.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use http::header::AUTHORIZATION;

use crate::domain::Tenant;

/// The configured keys, each kept only as its BLAKE3 hash with the tenant it stands for, and
/// the tenants' own retention policies.
pub struct ApiKeys {
    keys: Vec<(blake3::Hash, Key)>,
    retention: BTreeMap<Tenant, TenantRetention>,
}

/// A tenant's own retention, from `retain=` on its keys' lines: instead of `--retain-idle-days`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantRetention {
    /// Its sessions idle this many days are deleted.
    IdleDays(u32),
    /// Its sessions are never deleted for idleness (`retain=never`).
    Never,
}

/// The most days `retain=` takes: a hundred years.
const MAX_RETAIN_DAYS: u32 = 36_500;

/// Who a key stands for.
#[derive(Clone)]
pub struct Key {
    pub tenant: Tenant,
    pub admin: bool,
}

/// Marks a request whose caller may run the store-wide RPCs (BackupDatabase, CollectGarbage):
/// its key's line says `admin`, or the server has no keys (every caller is trusted alike).
#[derive(Debug, Clone, Copy)]
pub struct Admin;

/// Why a keys file was refused. Never contains a key.
#[derive(Debug, thiserror::Error)]
pub enum KeysFileError {
    #[error("cannot read the API keys file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("API keys file {}, line {line}: {problem}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("API keys file {} holds no keys", path.display())]
    Empty { path: PathBuf },
}

impl ApiKeys {
    /// Reads a keys file: one `tenant key` a line, then optionally `admin` (the key may also run
    /// the store-wide RPCs) and `retain=DAYS` or `retain=never` (the tenant's own retention
    /// instead of `--retain-idle-days`), in either order; blank lines and lines starting with
    /// `#` are ignored. A tenant may have several keys (to rotate them), whose `retain=` must
    /// agree; a key belongs to one line only.
    pub fn load(path: &Path) -> Result<Self, KeysFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| KeysFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ParseError::Line { line, problem } => KeysFileError::Line {
                path: path.to_owned(),
                line,
                problem,
            },
            ParseError::Empty => KeysFileError::Empty {
                path: path.to_owned(),
            },
        })
    }

    pub(crate) fn parse(text: &str) -> Result<Self, ParseError> {
        let mut keys: Vec<(blake3::Hash, Key)> = Vec::new();
        let mut lines_of_keys = Vec::new();
        let mut retention: BTreeMap<Tenant, (TenantRetention, usize)> = BTreeMap::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let problem = |problem: String| ParseError::Line {
                line: number,
                problem,
            };
            let fields: Vec<&str> = trimmed.split_whitespace().collect();
            let (tenant, key, options) = match fields[..] {
                [tenant, key, ref options @ ..] if options.len() <= 2 => (tenant, key, options),
                _ => {
                    let found = match fields.len() {
                        1 => "one field".to_owned(),
                        n => format!("{n} fields"),
                    };
                    return Err(problem(format!(
                        "expected `tenant key`, then `admin` and `retain=DAYS` if wanted, \
                         found {found}"
                    )));
                }
            };
            let (mut admin, mut retain) = (false, None);
            for option in options {
                match option.split_once('=') {
                    None if *option == "admin" && !admin => admin = true,
                    Some(("retain", value)) if retain.is_none() => {
                        retain = Some(retain_value(value).map_err(problem)?);
                    }
                    // Not echoed: a stray field may be a key.
                    _ => {
                        return Err(problem(
                            "after the key, only `admin` and `retain=DAYS` (or `retain=never`), \
                             once each"
                                .to_owned(),
                        ));
                    }
                }
            }
            // A key travels in an HTTP header, which carries visible ASCII only.
            if !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(problem(
                    "the key has characters other than visible ASCII".to_owned(),
                ));
            }
            if tenant.chars().any(char::is_control) {
                return Err(problem("the tenant has control characters".to_owned()));
            }
            let hash = blake3::hash(key.as_bytes());
            if let Some(i) = keys.iter().position(|(h, _)| *h == hash) {
                return Err(problem(format!(
                    "the same key as line {}: each key stands for one tenant",
                    lines_of_keys[i]
                )));
            }
            let tenant = Tenant::new(tenant);
            if let Some(retain) = retain {
                match retention.get(&tenant) {
                    Some((set, line)) if *set != retain => {
                        return Err(problem(format!(
                            "tenant {tenant}'s retain= differs from line {line}'s"
                        )));
                    }
                    _ => {
                        retention.insert(tenant.clone(), (retain, number));
                    }
                }
            }
            keys.push((hash, Key { tenant, admin }));
            lines_of_keys.push(number);
        }
        if keys.is_empty() {
            return Err(ParseError::Empty);
        }
        Ok(Self {
            keys,
            retention: retention
                .into_iter()
                .map(|(tenant, (retain, _))| (tenant, retain))
                .collect(),
        })
    }

    /// The tenants whose keys' lines set their own retention.
    pub fn retention(&self) -> &BTreeMap<Tenant, TenantRetention> {
        &self.retention
    }

    /// Keys configured.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant whose key `presented` is. Compares hashes (`blake3::Hash`'s `==` is
    /// constant-time) with every configured key, with no early exit, so the time taken says
    /// nothing about how close a guess came.
    pub fn key_of(&self, presented: &str) -> Option<Key> {
        let hash = blake3::hash(presented.as_bytes());
        let mut found = None;
        for (key, who) in &self.keys {
            if *key == hash {
                found = Some(who);
            }
        }
        found.cloned()
    }
}

/// Names the tenants' count only: a key, even hashed, never reaches a log.
impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeys")
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// The value of `retain=`: whole days from 1 to [`MAX_RETAIN_DAYS`], or `never`.
fn retain_value(value: &str) -> Result<TenantRetention, String> {
    if value == "never" {
        return Ok(TenantRetention::Never);
    }
    match value.parse::<u32>() {
        Ok(days @ 1..=MAX_RETAIN_DAYS) => Ok(TenantRetention::IdleDays(days)),
        _ => Err(format!(
            "retain= takes whole days from 1 to {MAX_RETAIN_DAYS}, or `never`; found {value:?}"
        )),
    }
}

#[derive(Debug)]
pub(crate) enum ParseError {
    Line { line: usize, problem: String },
    Empty,
}

/// The key of the one `authorization: Bearer <key>` header among `headers`, or the refusal
/// saying why not; `what` (the RPC or URL path) is only logged.
pub fn keyed(keys: &ApiKeys, headers: &http::HeaderMap, what: &str) -> Result<Key, Refusal> {
    let key = match presented_key(headers) {
        Ok(key) => keys.key_of(key).ok_or(Refusal::Invalid),
        Err(refusal) => Err(refusal),
    };
    key.inspect_err(|refusal| {
        tracing::debug!(rpc = what, reason = refusal.reason(), "refused a request");
    })
}

/// The tenant an HTTP request of the inspector (`serve --http`) acts for: the same keys, header
/// and refusals as every RPC, so the two ways in cannot disagree on who a caller is.
pub fn http_tenant(
    keys: Option<&ApiKeys>,
    headers: &http::HeaderMap,
    path: &str,
) -> Result<Tenant, Refusal> {
    match keys {
        None => Ok(Tenant::local()),
        Some(keys) => keyed(keys, headers, path).map(|key| key.tenant),
    }
}

/// The header that carries ctxd's own key through the model gateway, where `authorization`
/// and `x-api-key` carry the client's provider credentials.
pub const GATEWAY_KEY_HEADER: &str = "x-ctxd-api-key";

/// The tenant a model gateway request acts for: with keys, the one key in `x-ctxd-api-key`
/// (the bare key, or `Bearer <key>`); the refusal says why not.
pub fn gateway_tenant(
    keys: Option<&ApiKeys>,
    headers: &http::HeaderMap,
) -> Result<Tenant, &'static str> {
    let Some(keys) = keys else {
        return Ok(Tenant::local());
    };
    let mut values = headers.get_all(GATEWAY_KEY_HEADER).iter();
    let value = values
        .next()
        .ok_or("missing ctxd API key: send the header `x-ctxd-api-key: <key>`")?;
    let malformed = "malformed x-ctxd-api-key header: expected one key";
    if values.next().is_some() {
        return Err(malformed);
    }
    let value = value.to_str().map_err(|_| malformed)?.trim();
    let key = match value.split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") => key.trim(),
        _ => value,
    };
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(malformed);
    }
    keys.key_of(key)
        .map(|k| k.tenant)
        .ok_or("invalid ctxd API key (x-ctxd-api-key)")
}

/// Why a request's `authorization` header names no tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    Malformed,
    Invalid,
}

impl Refusal {
    fn reason(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Invalid => "invalid",
        }
    }

    /// What the caller is told: never the key.
    pub fn message(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing API key: send the header `authorization: Bearer <key>`",
            Refusal::Malformed => {
                "malformed authorization header: expected one `authorization: Bearer <key>`"
            }
            Refusal::Invalid => "invalid API key",
        }
    }
}

/// The key of the one `authorization: Bearer <key>` header.
fn presented_key(headers: &http::HeaderMap) -> Result<&str, Refusal> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(Refusal::Missing)?;
    if values.next().is_some() {
        return Err(Refusal::Malformed);
    }
    let value = value.to_str().map_err(|_| Refusal::Malformed)?;
    let (scheme, key) = value.trim().split_once(' ').ok_or(Refusal::Malformed)?;
    let key = key.trim_start();
    // The scheme is case-insensitive (RFC 9110 §11.1); the key is one token.
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() || key.contains(char::is_whitespace)
    {
        return Err(Refusal::Malformed);
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_error(text: &str) -> (usize, String) {
        match ApiKeys::parse(text) {
            Err(ParseError::Line { line, problem }) => (line, problem),
            Err(ParseError::Empty) => panic!("expected a line error, got: no keys"),
            Ok(keys) => panic!("expected a line error, got {keys:?}"),
        }
    }

    #[test]
    fn parses_tenants_and_keys_skipping_blanks_and_comments() {
        let keys = ApiKeys::parse(
            "# ops keys\n\nacme   k-acme-1\n  # rotated in March\nacme\tk-acme-2\nglobex k-globex\nops k-ops admin\n",
        )
        .expect("valid file");
        let tenant_of = |key: &str| {
            keys.key_of(key)
                .map(|k| (k.tenant.as_str().to_owned(), k.admin))
        };
        assert_eq!(keys.len(), 4);
        assert_eq!(tenant_of("k-acme-1"), Some(("acme".into(), false)));
        assert_eq!(tenant_of("k-acme-2"), Some(("acme".into(), false)));
        assert_eq!(tenant_of("k-globex"), Some(("globex".into(), false)));
        assert_eq!(tenant_of("k-ops"), Some(("ops".into(), true)));
        assert_eq!(tenant_of("k-globe"), None);
        assert_eq!(tenant_of(""), None);
    }

    #[test]
    fn bad_lines_name_their_number_and_never_the_key() {
        // Each file: the line at fault, what the problem says, and the key it must not show.
        for (keys, at, says, secret) in [
            (
                "acme k1\n\nsecret-only-key\n",
                3,
                "expected `tenant key`",
                "secret-only-key",
            ),
            (
                "# c\nacme k1 extra-secret\n",
                2,
                "only `admin` and `retain=DAYS`",
                "extra-secret",
            ),
            (
                "acme k1 admin more-secret\n",
                1,
                "only `admin` and `retain=DAYS`",
                "more-secret",
            ),
            (
                "acme k1 admin retain=3 most-secret\n",
                1,
                "found 5 fields",
                "most-secret",
            ),
            (
                "acme dup-secret\nglobex k2\nglobex dup-secret\n",
                3,
                "line 1",
                "dup-secret",
            ),
        ] {
            let (line, problem) = line_error(keys);
            assert_eq!(line, at, "{keys:?}");
            assert!(problem.contains(says), "{problem}");
            assert!(!problem.contains(secret), "{problem}");
        }

        let (line, problem) = line_error("acme k\u{e9}y\n");
        assert_eq!(line, 1);
        assert!(problem.contains("visible ASCII"), "{problem}");
    }

    #[test]
    fn a_line_may_set_its_tenants_retention() {
        let keys = ApiKeys::parse(
            "acme k1 retain=30\nacme k2 admin\nacme k3 retain=30 admin\nglobex k4 retain=never\n\
             initech k5\n",
        )
        .expect("valid file");
        assert_eq!(
            keys.retention().iter().collect::<Vec<_>>(),
            [
                (&Tenant::new("acme"), &TenantRetention::IdleDays(30)),
                (&Tenant::new("globex"), &TenantRetention::Never),
            ]
        );
        assert_eq!(keys.key_of("k3").map(|k| k.admin), Some(true));

        for (text, expected) in [
            ("acme k1 retain=0\n", "from 1 to 36500"),
            ("acme k1 retain=thirty\n", "\"thirty\""),
            ("acme k1 retain=36501\n", "from 1 to 36500"),
            ("acme k1 retain=\n", "found \"\""),
            ("acme k1 retain=3 retain=3\n", "once each"),
            ("acme k1 admin admin\n", "once each"),
        ] {
            let (line, problem) = line_error(text);
            assert_eq!(line, 1, "{text:?}");
            assert!(problem.contains(expected), "{text:?}: {problem}");
        }
        let (line, problem) = line_error("acme k1 retain=30\nglobex k2\nacme k3 retain=7\n");
        assert_eq!(line, 3);
        assert!(problem.contains("differs from line 1"), "{problem}");
    }

    #[test]
    fn a_file_without_keys_is_refused() {
        assert!(matches!(
            ApiKeys::parse("# nothing yet\n\n"),
            Err(ParseError::Empty)
        ));
    }

    #[test]
    fn the_debug_form_shows_no_hashes() {
        let keys = ApiKeys::parse("acme k1\n").expect("valid");
        let shown = format!("{keys:?}");
        assert_eq!(shown, "ApiKeys { keys: 1 }");
    }

    #[test]
    fn the_header_must_be_one_bearer_token() {
        let headers = |values: &[&str]| {
            let mut map = http::HeaderMap::new();
            for v in values {
                map.append(AUTHORIZATION, v.parse().expect("header value"));
            }
            map
        };
        assert!(matches!(
            presented_key(&headers(&[])),
            Err(Refusal::Missing)
        ));
        for bad in ["k1", "Basic k1", "Bearer", "Bearer ", "Bearer a b"] {
            assert!(
                matches!(presented_key(&headers(&[bad])), Err(Refusal::Malformed)),
                "{bad:?}"
            );
        }
        assert!(matches!(
            presented_key(&headers(&["Bearer k1", "Bearer k1"])),
            Err(Refusal::Malformed)
        ));
        assert!(matches!(presented_key(&headers(&["Bearer k1"])), Ok("k1")));
        assert!(matches!(presented_key(&headers(&["bearer  k1"])), Ok("k1")));
    }
}
