//! Who may see `/ui`: holders of the admin token (`STRATA_ADMIN_TOKEN`), as for `/admin`.
//!
//! A browser cannot send a bearer header by itself, so the page accepts the token:
//! * as `Authorization: Bearer <token>` on any page (scripts, curl);
//! * at the login request only: the form (`POST /ui/login`), or `GET /ui/login?token=…&next=…`
//!   for headless browsers and bookmarks. Each answers with a redirect that sets a session
//!   cookie and leaves the token out of every later address. A token in any other page's
//!   address is refused, so it never lands in a history or a proxy log by a page link.
//!
//! The session cookie `strata_ui` is a random id with its expiry, signed with a key derived
//! from the token (`{expiry}.{nonce}.{mac}`): nothing about the token can be read or guessed
//! from it, it lapses after [`SESSION_TTL`], a new admin token invalidates every session, and
//! any API replica with the same token accepts it (no session table). `HttpOnly;
//! SameSite=Strict; Path=/ui`, and `Secure` when the server is reached over HTTPS
//! (`STRATA_PUBLIC_URL`).
//!
//! The token is never logged: request spans record the path only, never the query.

use std::time::Duration;

use axum::extract::{Form, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::layout::{escape, page};
use crate::api::admin::tokens_equal;
use crate::api::AppState;

const COOKIE: &str = "strata_ui";

/// How long a session lasts after sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Seconds since the epoch by the database's clock: a session's expiry is judged by the clock
/// every API replica shares, like every other expiry (`crate::clock`).
async fn now_secs(state: &AppState) -> Result<u64, Response> {
    crate::streams::database_now(&state.pool)
        .await
        .map(|t| t.timestamp().max(0) as u64)
        .map_err(|e| crate::api::error::ApiError::from(e).into_response())
}

fn mac(token: &str, expires: u64, nonce: &str) -> String {
    let mut m = <Hmac<Sha256>>::new_from_slice(token.as_bytes()).expect("HMAC takes any key");
    m.update(b"strata-ui-session-v2\0");
    m.update(expires.to_string().as_bytes());
    m.update(b"\0");
    m.update(nonce.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// A fresh session for `token`, valid until `now + SESSION_TTL`.
fn new_session(token: &str, now: u64) -> String {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let expires = now + SESSION_TTL.as_secs();
    format!("{expires}.{nonce}.{}", mac(token, expires, &nonce))
}

/// Whether `value` is a session signed for `token` and not expired at `now`.
fn valid_session(value: &str, token: &str, now: u64) -> bool {
    let mut parts = value.splitn(3, '.');
    let (Some(expires), Some(nonce), Some(presented)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return false;
    };
    expires > now
        && expires <= now + SESSION_TTL.as_secs()
        && tokens_equal(presented, &mac(token, expires, nonce))
}

fn cookie_header(state: &AppState, token: &str, now: u64) -> HeaderValue {
    let secure = if state.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        new_session(token, now),
        SESSION_TTL.as_secs()
    ))
    .expect("digits, hex and dots are a valid header value")
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
    if query_token(request.uri()).is_some() {
        return login_page(
            StatusCode::UNAUTHORIZED,
            "A token in a page's address is not accepted: sign in here, or open /ui/login?token=…",
            request.uri().path(),
        );
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| tokens_equal(t.trim(), expected));
    if bearer == Some(true) {
        return next.run(request).await;
    }
    if let Some(session) = presented_session(request.headers()) {
        let now = match now_secs(&state).await {
            Ok(now) => now,
            Err(unavailable) => return unavailable,
        };
        if valid_session(&session, expected, now) {
            return next.run(request).await;
        }
    }
    login_page(
        StatusCode::UNAUTHORIZED,
        "Sign in with the admin token (STRATA_ADMIN_TOKEN).",
        request.uri().path(),
    )
}

fn login_page(status: StatusCode, message: &str, next: &str) -> Response {
    let body = format!(
        r#"<p>{}</p>
<form method="post" action="/ui/login">
  <input type="hidden" name="next" value="{}">
  <label>Admin token <input type="password" name="token" autocomplete="current-password"></label>
  <button type="submit">Sign in</button>
</form>"#,
        escape(message),
        escape(&safe_next(Some(next)))
    );
    let mut response = (status, page("sign in", &body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// Where a sign-in may send the browser: a page of `/ui`, never another site.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if (n == "/ui" || n.starts_with("/ui/") || n.starts_with("/ui?"))
                && !n.contains("//")
                && !n.contains('\\')
                && n != "/ui/login" =>
        {
            n.to_owned()
        }
        _ => "/ui".to_owned(),
    }
}

#[derive(Deserialize)]
pub struct Login {
    token: String,
    next: Option<String>,
}

#[derive(Deserialize)]
pub struct LoginLink {
    token: Option<String>,
    next: Option<String>,
}

/// A valid token: a fresh session cookie and the page asked for.
async fn signed_in(state: &AppState, token: &str, next: Option<&str>) -> Response {
    let now = match now_secs(state).await {
        Ok(now) => now,
        Err(unavailable) => return unavailable,
    };
    let mut response = Redirect::to(&safe_next(next)).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie_header(state, token, now));
    response
}

/// `POST /ui/login`: a valid token sets the session cookie and goes to `next` (or `/ui`).
pub async fn login(State(state): State<AppState>, Form(form): Form<Login>) -> Response {
    let Some(expected) = state.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return (StatusCode::SERVICE_UNAVAILABLE, Html("closed")).into_response();
    };
    if !tokens_equal(form.token.trim(), expected) {
        return login_page(
            StatusCode::UNAUTHORIZED,
            "That token is not valid.",
            form.next.as_deref().unwrap_or("/ui"),
        );
    }
    signed_in(&state, expected, form.next.as_deref()).await
}

/// `GET /ui/login[?token=…&next=…]`: the sign-in form, or, with a valid token, the session
/// cookie and `next`: the one address that takes a token, for browsers that cannot post.
pub async fn login_link(State(state): State<AppState>, Query(link): Query<LoginLink>) -> Response {
    let Some(expected) = state.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return (StatusCode::SERVICE_UNAVAILABLE, Html("closed")).into_response();
    };
    let next = link.next.as_deref().unwrap_or("/ui");
    match link.token {
        Some(t) if tokens_equal(t.trim(), expected) => {
            signed_in(&state, expected, Some(next)).await
        }
        Some(_) => login_page(StatusCode::UNAUTHORIZED, "That token is not valid.", next),
        None => login_page(
            StatusCode::OK,
            "Sign in with the admin token (STRATA_ADMIN_TOKEN).",
            next,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_in_the_address_is_found_and_decoded() {
        let uri: Uri = "/ui/builds/x?token=a%2Bb%3D&phase=error".parse().unwrap();
        assert_eq!(query_token(&uri).as_deref(), Some("a+b="));
        let uri: Uri = "/ui?phase=error".parse().unwrap();
        assert_eq!(query_token(&uri), None);
    }

    #[test]
    fn sessions_are_random_signed_and_expire() {
        let now = 1_000_000;
        let a = new_session("secret-token", now);
        let b = new_session("secret-token", now);
        assert_ne!(a, b, "every sign-in is a new session");
        assert!(!a.contains("secret-token"));
        assert!(valid_session(&a, "secret-token", now));
        assert!(valid_session(
            &a,
            "secret-token",
            now + SESSION_TTL.as_secs() - 1
        ));
        assert!(
            !valid_session(&a, "secret-token", now + SESSION_TTL.as_secs()),
            "expired"
        );
        assert!(
            !valid_session(&a, "another-token", now),
            "a new token ends it"
        );
        // An expiry pushed later breaks the signature; garbage is no session.
        let (exp, rest) = a.split_once('.').unwrap();
        let later = format!("{}.{rest}", exp.parse::<u64>().unwrap() + 10);
        assert!(!valid_session(&later, "secret-token", now));
        for junk in ["", "x", "1.2", "abc.def.ghi"] {
            assert!(!valid_session(junk, "secret-token", now), "{junk:?}");
        }
    }

    #[test]
    fn a_sign_in_only_ever_goes_to_a_page_of_ui() {
        assert_eq!(
            safe_next(Some("/ui/builds/x?phase=error")),
            "/ui/builds/x?phase=error"
        );
        assert_eq!(safe_next(Some("/ui")), "/ui");
        for bad in [
            "https://evil.example/",
            "//evil.example/ui",
            "/uix",
            "/ui//evil",
            "/admin",
            "/ui/login",
        ] {
            assert_eq!(safe_next(Some(bad)), "/ui", "{bad}");
        }
        assert_eq!(safe_next(None), "/ui");
    }
}
