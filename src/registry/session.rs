//! One repository on one registry, as one puller sees it: the endpoint, the credentials and
//! the token the `WWW-Authenticate` flow earned.
//!
//! Authentication follows the distribution spec: a request goes out anonymously (or with the
//! token already earned); a `401` names the scheme. `Basic` is answered with the credentials;
//! `Bearer` sends them (if any) to the token realm for a token scoped to pulling this
//! repository, and the request is retried once with it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Mutex;

use super::challenge::{self, Challenge};
use super::error::{summarize_body, PullError};
use super::reach::{Reach, Resolver};

/// How much of an error body is read (its summary shows 2 KiB of it).
const ERROR_BODY_LIMIT: usize = 64 << 10;
/// How large a token response may be.
const TOKEN_LIMIT: usize = 1 << 20;

/// A username and password for a registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicAuth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Clone)]
enum Authorization {
    None,
    Basic,
    Bearer(String),
}

pub struct Session {
    http: reqwest::Client,
    endpoint: String,
    repository: String,
    /// For messages: the image as the user named it.
    image: String,
    credentials: Option<BasicAuth>,
    authorization: Mutex<Authorization>,
    reach: Arc<Reach>,
}

/// The HTTP client every session shares: connection reuse across layers and pulls. Every name
/// it resolves and every redirect it follows passes `reach`.
pub fn http_client(reach: Arc<Reach>) -> reqwest::Client {
    let redirects = reach.clone();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(Arc::new(Resolver(reach)))
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 10 {
                return attempt.error("more than 10 redirects");
            }
            match redirects.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(why) => attempt.error(format!("refusing a redirect: {why}")),
            }
        }))
        .build()
        .expect("the HTTP client configuration is valid")
}

impl Session {
    pub fn new(
        http: reqwest::Client,
        endpoint: String,
        repository: String,
        image: String,
        credentials: Option<BasicAuth>,
        reach: Arc<Reach>,
    ) -> Session {
        Session {
            http,
            endpoint,
            repository,
            image,
            credentials,
            authorization: Mutex::new(Authorization::None),
            reach,
        }
    }

    fn refused(&self, detail: String) -> PullError {
        PullError::Refused {
            image: self.image.clone(),
            detail,
        }
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// `GET /v2/<repository>/<kind>/<reference>`, authenticated as the registry asks, with
    /// error statuses turned into [`PullError`]s.
    pub async fn get(
        &self,
        kind: &str,
        reference: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, PullError> {
        let url = format!(
            "{}/v2/{}/{}/{}",
            self.endpoint, self.repository, kind, reference
        );
        let parsed = reqwest::Url::parse(&url).map_err(|e| self.refused(format!("{url}: {e}")))?;
        self.reach.check_url(&parsed).map_err(|e| self.refused(e))?;
        let mut authenticated = false;
        loop {
            let auth = self.authorization.lock().await.clone();
            let mut request = self.http.get(&url);
            if let Some(a) = accept {
                request = request.header(reqwest::header::ACCEPT, a);
            }
            request = match (&auth, &self.credentials) {
                (Authorization::Bearer(token), _) => request.bearer_auth(token),
                (Authorization::Basic, Some(c)) => {
                    request.basic_auth(&c.username, Some(&c.password))
                }
                _ => request,
            };
            let response = request.send().await.map_err(|e| self.transport(e))?;
            if response.status() == reqwest::StatusCode::UNAUTHORIZED && !authenticated {
                let header = response
                    .headers()
                    .get_all(reqwest::header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(challenge::parse);
                let Some(challenge) = header else {
                    return Err(self.status_error(response).await);
                };
                let next = self.answer(challenge).await?;
                *self.authorization.lock().await = next;
                authenticated = true;
                continue;
            }
            if !response.status().is_success() {
                return Err(self.status_error(response).await);
            }
            return Ok(response);
        }
    }

    async fn answer(&self, challenge: Challenge) -> Result<Authorization, PullError> {
        match challenge {
            Challenge::Basic => match &self.credentials {
                Some(_) => Ok(Authorization::Basic),
                None => Err(PullError::Unauthorized {
                    image: self.image.clone(),
                    detail: "the registry requires a username and password and none were given"
                        .into(),
                }),
            },
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let mut query: Vec<(&str, &str)> = vec![("scope", &scope)];
                if let Some(s) = &service {
                    query.push(("service", s));
                }
                // Checked before anything, credentials included, is sent there.
                let realm = self
                    .reach
                    .check_realm(&self.endpoint, &realm)
                    .map_err(|e| self.refused(e))?;
                let mut request = self.http.get(realm).query(&query);
                if let Some(c) = &self.credentials {
                    request = request.basic_auth(&c.username, Some(&c.password));
                }
                let response = request.send().await.map_err(|e| self.transport(e))?;
                if !response.status().is_success() {
                    return Err(self.status_error(response).await);
                }
                let body: serde_json::Value = read_limited(response, TOKEN_LIMIT)
                    .await
                    .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
                    .map_err(|detail| PullError::Malformed {
                        image: self.image.clone(),
                        what: "token response",
                        detail,
                    })?;
                let token = body["token"]
                    .as_str()
                    .or(body["access_token"].as_str())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| PullError::Malformed {
                        image: self.image.clone(),
                        what: "token response",
                        detail: "it holds no token".into(),
                    })?;
                Ok(Authorization::Bearer(token.to_owned()))
            }
        }
    }

    fn transport(&self, e: reqwest::Error) -> PullError {
        // reqwest's message names the URL, which carries no credentials (they travel in
        // headers only).
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            source = s.source();
        }
        PullError::Transport {
            image: self.image.clone(),
            detail,
        }
    }

    async fn status_error(&self, response: reqwest::Response) -> PullError {
        let status = response.status();
        let body = read_limited(response, ERROR_BODY_LIMIT)
            .await
            .unwrap_or_default();
        let detail = summarize_body(&body);
        let image = self.image.clone();
        match status.as_u16() {
            401 | 403 => PullError::Unauthorized { image, detail },
            404 => PullError::NotFound { image, detail },
            429 => PullError::RateLimited {
                image,
                message: detail,
            },
            s => PullError::Registry {
                image,
                status: s,
                detail,
            },
        }
    }
}

/// The body, if it is at most `limit` bytes; a longer one is cut at `limit` and refused.
pub(crate) async fn read_limited(
    response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let room = limit.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if chunk.len() > room {
            return Err(format!("it is larger than {limit} bytes"));
        }
    }
    Ok(out)
}
