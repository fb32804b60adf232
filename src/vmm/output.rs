//! A command's output on its way from the sandbox's pipes to whoever reads it.
//!
//! Every hop is bounded: [`OutputSink`] holds at most [`LINES_IN_FLIGHT`] lines (each at most
//! 64 KiB), and a line waits for room. So a command that writes faster than its reader keeps
//! up waits in its own `write(2)`, as it would on a terminal, instead of growing the node's
//! memory (issue 46: a `yes` of 60 KB lines grew a server by 189 MiB). A reader that goes away
//! does not stop the command: its lines are read and dropped.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::backend::{OutputLine, OutputStream};

/// Lines queued per command before the sandbox's pipes wait: at most 1 MiB of 64 KiB lines.
pub const LINES_IN_FLIGHT: usize = 16;

/// Where a command's output lines go.
#[derive(Debug, Clone)]
pub struct OutputSink {
    tx: Option<mpsc::Sender<OutputLine>>,
}

/// The reading end of [`OutputSink::channel`].
pub type OutputReceiver = mpsc::Receiver<OutputLine>;

impl OutputSink {
    /// A bounded channel: the receiver must be read while the command runs.
    pub fn channel() -> (OutputSink, OutputReceiver) {
        let (tx, rx) = mpsc::channel(LINES_IN_FLIGHT);
        (OutputSink { tx: Some(tx) }, rx)
    }

    /// Output nobody reads: every line is dropped.
    pub fn discard() -> OutputSink {
        OutputSink { tx: None }
    }

    /// Sends `line` once there is room; false when nobody reads any more (the line is dropped,
    /// and so will every later one be).
    pub async fn send(&self, line: OutputLine) -> bool {
        match &self.tx {
            Some(tx) => tx.send(line).await.is_ok(),
            None => false,
        }
    }

    /// A sink whose lines are kept, up to `max_bytes` of them, by a task that reads them as
    /// they come: for callers that look at the output once the command is over (an error
    /// message, a value). Lines past `max_bytes` are counted, not kept.
    pub fn collect(max_bytes: usize) -> (OutputSink, Collecting) {
        let (sink, mut rx) = OutputSink::channel();
        let task = tokio::spawn(async move {
            let mut out = Collected::default();
            let mut kept = 0usize;
            while let Some(line) = rx.recv().await {
                let size = line.line.len() + 1;
                if kept + size <= max_bytes {
                    kept += size;
                    out.lines.push(line);
                } else {
                    out.dropped_lines += 1;
                    out.dropped_bytes += size as u64;
                }
            }
            out
        });
        (sink, Collecting(task))
    }
}

/// The task behind [`OutputSink::collect`].
pub struct Collecting(JoinHandle<Collected>);

impl Collecting {
    /// Everything kept, once every copy of the sink is gone (the command's pumps end with it).
    pub async fn finish(self) -> Collected {
        self.0.await.unwrap_or_default()
    }
}

/// What [`OutputSink::collect`] kept.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    pub lines: Vec<OutputLine>,
    /// Lines (and their bytes, newlines included) past the limit.
    pub dropped_lines: u64,
    pub dropped_bytes: u64,
}

impl Collected {
    /// The kept lines of `stream`, each ending in a newline.
    pub fn text(&self, stream: OutputStream) -> String {
        self.lines
            .iter()
            .filter(|l| l.stream == stream)
            .map(|l| format!("{}\n", l.line))
            .collect()
    }

    /// The kept lines of `stream`.
    pub fn lines_of(&self, stream: OutputStream) -> Vec<String> {
        self.lines
            .iter()
            .filter(|l| l.stream == stream)
            .map(|l| l.line.clone())
            .collect()
    }

    /// Every kept line, both streams in order, joined by newlines.
    pub fn joined(&self) -> String {
        self.lines
            .iter()
            .map(|l| l.line.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> OutputLine {
        OutputLine {
            stream: OutputStream::Stdout,
            at: chrono::Utc::now(),
            line: text.into(),
        }
    }

    #[tokio::test]
    async fn a_full_channel_makes_the_sender_wait_until_the_reader_reads() {
        let (sink, mut rx) = OutputSink::channel();
        for i in 0..LINES_IN_FLIGHT {
            assert!(sink.send(line(&i.to_string())).await);
        }
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            sink.send(line("one too many")),
        )
        .await;
        assert!(blocked.is_err(), "a full channel took another line");
        assert_eq!(rx.recv().await.unwrap().line, "0");
        assert!(sink.send(line("now there is room")).await);
        drop(rx);
        assert!(!sink.send(line("nobody reads")).await);
        assert!(!OutputSink::discard().send(line("x")).await);
    }

    #[tokio::test]
    async fn collect_keeps_lines_up_to_its_limit_and_counts_the_rest() {
        let (sink, collecting) = OutputSink::collect(10);
        for text in ["abcd", "efgh", "ijkl", "m"] {
            assert!(sink.send(line(text)).await);
        }
        drop(sink);
        let got = collecting.finish().await;
        assert_eq!(got.text(OutputStream::Stdout), "abcd\nefgh\n");
        assert_eq!((got.dropped_lines, got.dropped_bytes), (2, 7));
    }
}
