//! Keyset paging for the `/ui` lists: newest first, a page of `limit` rows, and an "older" link
//! that carries the last row's key (`before=`) so a page never shifts when new rows arrive.

use chrono::{DateTime, Utc};

use super::builds::UiError;
use super::layout::url_encode;

/// Rows per page unless `limit=` says otherwise.
pub const DEFAULT_LIMIT: i64 = 200;
/// The largest page `limit=` may ask for.
pub const MAX_LIMIT: i64 = 1000;

/// A row's place in a newest-first list: its time, then its id to break ties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub at: DateTime<Utc>,
    pub id: String,
}

impl Cursor {
    /// `2026-12-01T05:00:00.123456Z_<id>`, as `before=` carries it.
    pub fn encode(&self) -> String {
        format!(
            "{}_{}",
            self.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            self.id
        )
    }

    pub fn parse(s: &str) -> Result<Cursor, UiError> {
        let bad =
            || UiError::BadRequest(format!("before={s:?} is not a cursor from an older link"));
        let (at, id) = s.split_once('_').ok_or_else(bad)?;
        let at = DateTime::parse_from_rfc3339(at).map_err(|_| bad())?;
        if id.is_empty() {
            return Err(bad());
        }
        Ok(Cursor {
            at: at.with_timezone(&Utc),
            id: id.to_owned(),
        })
    }
}

/// The page size `limit=` asks for, within 1..=[`MAX_LIMIT`].
pub fn limit(asked: Option<i64>) -> Result<i64, UiError> {
    match asked {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(UiError::BadRequest(format!(
            "limit={n} is out of range: ask for 1 to {MAX_LIMIT} rows"
        ))),
    }
}

/// The "older" link below a list: `path?<params>&before=<last>&limit=<n>`, or nothing when the
/// page was the last one (the query fetched `limit + 1` rows to know).
pub fn older_link(
    path: &str,
    params: &[(&str, Option<&str>)],
    last: Option<Cursor>,
    limit: i64,
) -> String {
    let Some(last) = last else {
        return String::new();
    };
    let mut query: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", url_encode(v))))
        .collect();
    query.push(format!("before={}", url_encode(&last.encode())));
    if limit != DEFAULT_LIMIT {
        query.push(format!("limit={limit}"));
    }
    format!(
        "<p class=\"paging\"><a id=\"older\" href=\"{path}?{}\">older →</a></p>",
        query.join("&amp;")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_garbage_is_refused() {
        let c = Cursor {
            at: DateTime::parse_from_rfc3339("2026-12-01T05:00:00.123456Z")
                .unwrap()
                .with_timezone(&Utc),
            id: "0c6f1b5e-aaaa-4bbb-8ccc-000000000001".into(),
        };
        assert_eq!(Cursor::parse(&c.encode()).unwrap(), c);
        for bad in ["", "nope", "2026-12-01T05:00:00Z_", "yesterday_x"] {
            assert!(Cursor::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_outside_the_range_are_refused() {
        assert_eq!(limit(None).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit(Some(1)).unwrap(), 1);
        assert!(limit(Some(0)).is_err());
        assert!(limit(Some(MAX_LIMIT + 1)).is_err());
    }
}
