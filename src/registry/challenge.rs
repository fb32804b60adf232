//! `WWW-Authenticate` challenges (RFC 7235) as registries send them:
//! `Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull"`
//! or `Basic realm="Registry Realm"`.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses one challenge header; `None` for schemes this client does not speak.
pub fn parse(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header
        .split_once(char::is_whitespace)
        .unwrap_or((header, ""));
    let params = params(rest);
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        _ => None,
    }
}

/// `key=value` and `key="quoted, value"` pairs separated by commas.
fn params(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ','))
            .collect::<String>()
            .trim()
            .to_ascii_lowercase();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            continue;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ','))
                .collect::<String>()
                .trim()
                .to_owned();
        }
        out.insert(key, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_and_distribution_challenges() {
        assert_eq!(
            parse(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/debian:pull".into()),
            })
        );
        assert_eq!(
            parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse(r#"bearer realm=https://x/token, scope="repository:a/b:pull,push""#),
            Some(Challenge::Bearer {
                realm: "https://x/token".into(),
                service: None,
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse("Bearer service=x"),
            None,
            "a bearer challenge needs a realm"
        );
        assert_eq!(parse("Negotiate"), None);
    }
}
