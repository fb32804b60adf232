//! Who may see `/ui`: holders of the admin token (`STRATA_ADMIN_TOKEN`), as for `/admin`.
//!
//! A browser cannot send a bearer header by itself, so the page accepts the token three ways:
//! * `Authorization: Bearer <token>` (scripts, curl);
//! * the login form (`POST /ui/login`), or a link with `?token=<token>` (headless browsers,
//!   bookmarks), each answered with a redirect that sets a session cookie and drops the token
//!   from the address bar;
//! * the session cookie `strata_ui`: a keyed digest of the token, not the token itself,
//!   `HttpOnly; SameSite=Strict; Path=/ui`, so it is never readable by scripts nor sent
//!   cross-site. Changing the admin token invalidates every session.
//!
//! The token is never logged: request spans record the path only, never the query.

use axum::extract::{Form, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::layout::{escape, page};
use crate::api::admin::tokens_equal;
use crate::api::AppState;

const COOKIE: &str = "strata_ui";

/// The session cookie's value for `token`.
fn session_of(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"strata-ui-session\0");
    h.update(token.as_bytes());
    hex::encode(h.finalize())
}

fn cookie_header(token: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict",
        session_of(token)
    ))
    .expect("hex is a valid header value")
}

fn presented_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("strata_ui=").map(str::to_owned))
}

fn query_token(uri: &Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "token").then(|| percent_decode(v))
    })
}

/// The query without its `token` parameter.
fn query_without_token(uri: &Uri) -> String {
    let rest: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("token="))
        .collect();
    if rest.is_empty() {
        String::new()
    } else {
        format!("?{}", rest.join("&"))
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lets the request through with a valid token or session; otherwise the login page (401), or
/// 503 when the server has no admin token.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            page(
                "closed",
                "<p>The operator page is closed: start the server with STRATA_ADMIN_TOKEN set.</p>",
            ),
        )
            .into_response();
    };
    if let Some(token) = query_token(request.uri()) {
        if tokens_equal(&token, expected) {
            let target = format!(
                "{}{}",
                request.uri().path(),
                query_without_token(request.uri())
            );
            let mut response = Redirect::to(&target).into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, cookie_header(expected));
            return response;
        }
        return login_page(StatusCode::UNAUTHORIZED, "That token is not valid.");
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| tokens_equal(t.trim(), expected));
    let session =
        presented_session(request.headers()).map(|s| tokens_equal(&s, &session_of(expected)));
    if bearer == Some(true) || session == Some(true) {
        return next.run(request).await;
    }
    login_page(
        StatusCode::UNAUTHORIZED,
        "Sign in with the admin token (STRATA_ADMIN_TOKEN).",
    )
}

fn login_page(status: StatusCode, message: &str) -> Response {
    let body = format!(
        r#"<p>{}</p>
<form method="post" action="/ui/login">
  <label>Admin token <input type="password" name="token" autocomplete="current-password"></label>
  <button type="submit">Sign in</button>
</form>"#,
        escape(message)
    );
    let mut response = (status, page("sign in", &body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[derive(Deserialize)]
pub struct Login {
    token: String,
}

/// `POST /ui/login`: a valid token sets the session cookie and goes to the builds list.
pub async fn login(State(state): State<AppState>, Form(form): Form<Login>) -> Response {
    let Some(expected) = state.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return (StatusCode::SERVICE_UNAVAILABLE, Html("closed")).into_response();
    };
    if !tokens_equal(form.token.trim(), expected) {
        return login_page(StatusCode::UNAUTHORIZED, "That token is not valid.");
    }
    let mut response = Redirect::to("/ui").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie_header(expected));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_leaves_the_address_and_is_decoded() {
        let uri: Uri = "/ui/builds/x?token=a%2Bb%3D&phase=error".parse().unwrap();
        assert_eq!(query_token(&uri).as_deref(), Some("a+b="));
        assert_eq!(query_without_token(&uri), "?phase=error");
        let uri: Uri = "/ui?token=abc".parse().unwrap();
        assert_eq!(query_without_token(&uri), "");
    }

    #[test]
    fn the_session_is_not_the_token() {
        let s = session_of("secret-token");
        assert!(!s.contains("secret-token"));
        assert_eq!(s, session_of("secret-token"));
        assert_ne!(s, session_of("secret-token2"));
    }
}
