//! Progress of long CLI work on a terminal: one line on stderr, rewritten in place, with the
//! stage, a detail and the elapsed time. Quiet when stderr is not a terminal (piped, in CI, in
//! a log file), so scripts see only the command's stdout. `STRATA_PROGRESS=always|never`
//! overrides the detection.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the elapsed time is redrawn.
const TICK: Duration = Duration::from_millis(250);

#[derive(Default)]
struct Line {
    stage: String,
    detail: String,
    started: Option<Instant>,
    finished: bool,
}

/// A progress line; cheap to clone into blocking tasks.
#[derive(Clone)]
pub struct Progress {
    enabled: bool,
    line: Arc<Mutex<Line>>,
}

impl Progress {
    /// Enabled when stderr is a terminal (see the module docs for the override).
    pub fn for_stderr() -> Progress {
        let enabled = match std::env::var("STRATA_PROGRESS").as_deref() {
            Ok("always") => true,
            Ok("never") => false,
            _ => std::io::stderr().is_terminal(),
        };
        let progress = Progress {
            enabled,
            line: Arc::default(),
        };
        if enabled {
            let ticker = progress.clone();
            std::thread::spawn(move || loop {
                std::thread::sleep(TICK);
                if ticker.line.lock().map(|l| l.finished).unwrap_or(true) {
                    return;
                }
                ticker.draw();
            });
        }
        progress
    }

    /// Starts a stage: `[n/total] what`.
    pub fn stage(&self, n: usize, total: usize, what: &str) {
        if let Ok(mut l) = self.line.lock() {
            l.stage = format!("[{n}/{total}] {what}");
            l.detail.clear();
            l.started = Some(Instant::now());
        }
        self.draw();
    }

    /// Sets the current stage's detail (e.g. `layer 2/5, 14.2 MiB`).
    pub fn detail(&self, detail: impl Into<String>) {
        if let Ok(mut l) = self.line.lock() {
            l.detail = detail.into();
        }
        self.draw();
    }

    /// Ends the current stage with `outcome`, leaving its line on the terminal.
    pub fn finish_stage(&self, outcome: &str) {
        if !self.enabled {
            return;
        }
        if let Ok(l) = self.line.lock() {
            let took = l.started.map(|s| s.elapsed()).unwrap_or_default();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(
                err,
                "\r\x1b[2K{} {outcome} ({:.1}s)",
                l.stage,
                took.as_secs_f64()
            );
        }
    }

    /// Stops redrawing.
    pub fn finish(&self) {
        if let Ok(mut l) = self.line.lock() {
            l.finished = true;
        }
    }

    fn draw(&self) {
        if !self.enabled {
            return;
        }
        if let Ok(l) = self.line.lock() {
            if l.finished || l.stage.is_empty() {
                return;
            }
            let took = l.started.map(|s| s.elapsed()).unwrap_or_default();
            let mut err = std::io::stderr().lock();
            let sep = if l.detail.is_empty() { "" } else { ": " };
            let _ = write!(
                err,
                "\r\x1b[2K{}{sep}{} {:.0}s",
                l.stage,
                l.detail,
                took.as_secs_f64().floor()
            );
            let _ = err.flush();
        }
    }
}

/// `12.3 MiB`.
pub fn bytes(n: u64) -> String {
    strata::metrics::storage::human_bytes(n)
}
