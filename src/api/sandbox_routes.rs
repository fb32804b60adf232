//! Where a request for a running sandbox goes (its node's agent) and what its ports ask for,
//! read from the `sandboxes` read model once and kept until the sandbox's stream has news.
//!
//! Every envd call and every port request names a sandbox; reading its row each time cost
//! about half of the API's hop (ADR 0035). A kept route is used only while this process
//! listens for stream news (a reconnect wakes every watch, so nothing missed in between is
//! trusted) and until anything is appended to the sandbox's stream: a pause, a resume on
//! another node and an end each drop it. The watch is taken before the read, so an append
//! between the two is not missed. Only running sandboxes' routes are kept; at most
//! [`MAX_KEPT`], the whole set dropped when full (a re-read costs one query).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::stream_news::{StreamNews, StreamWatch};
use crate::domain::sandbox::SandboxId;

/// Most routes kept at once.
const MAX_KEPT: usize = 4096;

/// What a request for a running sandbox needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub agent_url: String,
    /// What a request for one of its ports must carry; `None`: they are public.
    pub traffic_token: Option<String>,
}

#[derive(Default)]
pub struct SandboxRoutes {
    kept: Mutex<HashMap<String, (Arc<Route>, StreamWatch)>>,
}

impl SandboxRoutes {
    /// The route of sandbox `id` if it runs somewhere now; `None` when it is unknown, not
    /// running, or runs on no node yet.
    pub async fn route(
        &self,
        pool: &sqlx::PgPool,
        news: &StreamNews,
        id: &SandboxId,
    ) -> Result<Option<Arc<Route>>, sqlx::Error> {
        if let Some(route) = self.kept(news, id) {
            return Ok(Some(route));
        }
        let watch = news.watch_stream(crate::streams::sandbox_stream(id).as_str().to_owned());
        let row = crate::projections::sandboxes::get(pool, id.as_str()).await?;
        let route = row.filter(|r| r.state == "running").and_then(|r| {
            Some(Arc::new(Route {
                agent_url: r.agent_url?,
                traffic_token: r.traffic_token,
            }))
        });
        if let (Some(route), Some(watch)) = (&route, watch) {
            let mut kept = self.kept.lock().expect("sandbox routes lock");
            if kept.len() >= MAX_KEPT {
                kept.clear();
            }
            kept.insert(id.as_str().to_owned(), (route.clone(), watch));
        }
        Ok(route)
    }

    fn kept(&self, news: &StreamNews, id: &SandboxId) -> Option<Arc<Route>> {
        let mut kept = self.kept.lock().expect("sandbox routes lock");
        let (route, watch) = kept.get(id.as_str())?;
        if news.is_listening() && !watch.has_changed() {
            return Some(route.clone());
        }
        kept.remove(id.as_str());
        None
    }
}
