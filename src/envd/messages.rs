//! envd's `process.Process` and `filesystem.Filesystem` messages (`SANDBOX-PROTOCOL.md` §5, §6),
//! with protojson's mapping (§4.4): lowerCamelCase names, default values (0, false, "", empty
//! lists and maps, unset optionals) omitted on output as real envd omits them, `bytes` as padded
//! standard base64, enums by name. Unknown fields are ignored on input, as protojson does for
//! clients newer than the server.
//!
//! A proto `oneof` is a Rust enum. On the wire it is an object with exactly one of its fields;
//! inputs are read through a struct of optionals, so unknown fields beside it are ignored too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};

/// `bytes` fields: standard base64 with padding on output; on input, like protojson, the
/// URL-safe alphabet and missing padding are accepted as well.
mod b64 {
    use base64::alphabet;
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
    use base64::engine::DecodePaddingMode;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    const LENIENT: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
    const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        decode(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }

    pub fn decode(text: &str) -> Result<Vec<u8>, String> {
        STANDARD_LENIENT
            .decode(text)
            .or_else(|_| URL_SAFE_LENIENT.decode(text))
            .map_err(|e| format!("invalid base64: {e}"))
    }
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Serializes `{key: value}`: a set oneof field.
fn one_field<S: Serializer, V: Serialize + ?Sized>(
    s: S,
    key: &'static str,
    value: &V,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap as _;
    let mut map = s.serialize_map(Some(1))?;
    map.serialize_entry(key, value)?;
    map.end()
}

/// The one set field of a oneof read as a struct of optionals.
fn exactly_one<T>(oneof: &str, set: impl IntoIterator<Item = Option<T>>) -> Result<T, String> {
    let mut set = set.into_iter().flatten();
    match (set.next(), set.next()) {
        (Some(v), None) => Ok(v),
        (None, _) => Err(format!("{oneof}: none of its fields is set")),
        (Some(_), Some(_)) => Err(format!("{oneof}: more than one of its fields is set")),
    }
}

/// An empty message (`KeepAlive`, `StartEvent` of WatchDir).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

// ---------------------------------------------------------------------------------------------
// process.Process

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cmd: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// An overlay on the sandbox's environment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Unset: the sandbox's working directory, or the user's home.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PtySize {
    #[serde(skip_serializing_if = "is_zero")]
    pub cols: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub rows: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Pty {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartRequest {
    pub process: ProcessConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    /// Never sent by the SDK; envd tags its own system processes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Whether the process gets a stdin pipe. The SDK sends `false` unless asked, and omits it
    /// for PTY sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// Which process a call addresses: `{"pid":N}` or `{"tag":"t"}`. The SDK only ever uses pids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "SelectorWire")]
pub enum ProcessSelector {
    Pid(u32),
    Tag(String),
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SelectorWire {
    pid: Option<u32>,
    tag: Option<String>,
}

impl TryFrom<SelectorWire> for ProcessSelector {
    type Error = String;
    fn try_from(w: SelectorWire) -> Result<Self, String> {
        exactly_one(
            "the process selector",
            [
                w.pid.map(ProcessSelector::Pid),
                w.tag.map(ProcessSelector::Tag),
            ],
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    pub process: ProcessSelector,
}

/// Signals by name; protojson also accepts their numbers on input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "EnumWire")]
pub enum Signal {
    #[default]
    #[serde(rename = "SIGNAL_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "SIGNAL_SIGTERM")]
    Sigterm,
    #[serde(rename = "SIGNAL_SIGKILL")]
    Sigkill,
}

/// A proto enum as protojson reads it: its name or its number.
#[derive(Deserialize)]
#[serde(untagged)]
enum EnumWire {
    Name(String),
    Number(i64),
}

impl TryFrom<EnumWire> for Signal {
    type Error = String;
    fn try_from(w: EnumWire) -> Result<Self, String> {
        match w {
            EnumWire::Name(n) if n == "SIGNAL_UNSPECIFIED" => Ok(Signal::Unspecified),
            EnumWire::Name(n) if n == "SIGNAL_SIGTERM" => Ok(Signal::Sigterm),
            EnumWire::Name(n) if n == "SIGNAL_SIGKILL" => Ok(Signal::Sigkill),
            EnumWire::Number(0) => Ok(Signal::Unspecified),
            EnumWire::Number(15) => Ok(Signal::Sigterm),
            EnumWire::Number(9) => Ok(Signal::Sigkill),
            EnumWire::Name(n) => Err(format!("unknown signal {n:?}")),
            EnumWire::Number(n) => Err(format!("unknown signal {n}")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub signal: Signal,
}

/// Input for a process: `{"stdin":"<b64>"}` for its stdin pipe, `{"pty":"<b64>"}` for its
/// terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "InputWire")]
pub enum ProcessInput {
    Stdin(#[serde(serialize_with = "b64::serialize")] Vec<u8>),
    Pty(#[serde(serialize_with = "b64::serialize")] Vec<u8>),
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct InputWire {
    stdin: Option<String>,
    pty: Option<String>,
}

impl TryFrom<InputWire> for ProcessInput {
    type Error = String;
    fn try_from(w: InputWire) -> Result<Self, String> {
        let stdin = w.stdin.map(|t| b64::decode(&t).map(ProcessInput::Stdin));
        let pty = w.pty.map(|t| b64::decode(&t).map(ProcessInput::Pty));
        exactly_one("the process input", [stdin, pty])?
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseStdinRequest {
    pub process: ProcessSelector,
}

/// A PTY resize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateRequest {
    pub process: ProcessSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessInfo {
    /// A set message field: present even when all of it is default.
    pub config: ProcessConfig,
    #[serde(skip_serializing_if = "is_zero")]
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// One message of `StreamInput`'s request stream: first `start` (which process), then `data`
/// and `keepalive`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "StreamInputWire")]
pub enum StreamInputRequest {
    Start { process: ProcessSelector },
    Data { input: ProcessInput },
    Keepalive,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamInputWire {
    start: Option<StreamStartWire>,
    data: Option<StreamDataWire>,
    keepalive: Option<Empty>,
}

#[derive(Deserialize)]
struct StreamStartWire {
    process: ProcessSelector,
}

#[derive(Deserialize)]
struct StreamDataWire {
    input: ProcessInput,
}

impl TryFrom<StreamInputWire> for StreamInputRequest {
    type Error = String;
    fn try_from(w: StreamInputWire) -> Result<Self, String> {
        exactly_one(
            "the stream input event",
            [
                w.start
                    .map(|s| StreamInputRequest::Start { process: s.process }),
                w.data.map(|d| StreamInputRequest::Data { input: d.input }),
                w.keepalive.map(|_| StreamInputRequest::Keepalive),
            ],
        )
    }
}

/// One message of a `Start` or `Connect` stream, serialized with its `StartResponse` wrapper:
/// `{"event":{"start":{"pid":N}}}`. The stream is `start`, then data and keepalives, then one
/// `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    Start { pid: u32 },
    Data(DataEvent),
    End(EndEvent),
    Keepalive,
}

impl ProcessEvent {
    pub fn start(pid: u32) -> ProcessEvent {
        ProcessEvent::Start { pid }
    }

    pub fn stdout(bytes: Vec<u8>) -> ProcessEvent {
        ProcessEvent::Data(DataEvent::Stdout(bytes))
    }

    pub fn stderr(bytes: Vec<u8>) -> ProcessEvent {
        ProcessEvent::Data(DataEvent::Stderr(bytes))
    }

    pub fn pty(bytes: Vec<u8>) -> ProcessEvent {
        ProcessEvent::Data(DataEvent::Pty(bytes))
    }

    pub fn end(end: EndEvent) -> ProcessEvent {
        ProcessEvent::End(end)
    }

    pub fn keepalive() -> ProcessEvent {
        ProcessEvent::Keepalive
    }

    pub fn is_end(&self) -> bool {
        matches!(self, ProcessEvent::End(_))
    }
}

impl Serialize for ProcessEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Oneof<'a>(&'a ProcessEvent);
        impl Serialize for Oneof<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                #[derive(Serialize)]
                struct StartEvent {
                    #[serde(skip_serializing_if = "is_zero")]
                    pid: u32,
                }
                match self.0 {
                    ProcessEvent::Start { pid } => one_field(s, "start", &StartEvent { pid: *pid }),
                    ProcessEvent::Data(data) => one_field(s, "data", data),
                    ProcessEvent::End(end) => one_field(s, "end", end),
                    ProcessEvent::Keepalive => one_field(s, "keepalive", &Empty {}),
                }
            }
        }
        one_field(s, "event", &Oneof(self))
    }
}

/// A chunk of a process's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DataEvent {
    Stdout(#[serde(with = "b64")] Vec<u8>),
    Stderr(#[serde(with = "b64")] Vec<u8>),
    Pty(#[serde(with = "b64")] Vec<u8>),
}

/// How a process ended, in the words of Go's `os.ProcessState`, which the SDK shows its users.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndEvent {
    #[serde(skip_serializing_if = "is_zero")]
    pub exit_code: i32,
    #[serde(skip_serializing_if = "is_zero")]
    pub exited: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EndEvent {
    /// The process exited with `code`; a non-zero code is also its error.
    pub fn exited(code: i32) -> EndEvent {
        let status = format!("exit status {code}");
        EndEvent {
            exit_code: code,
            exited: true,
            error: (code != 0).then(|| status.clone()),
            status,
        }
    }

    /// The process died of a signal, named as Go names it (`"killed"`, `"terminated"`).
    pub fn signaled(signal: &str) -> EndEvent {
        EndEvent::failed(format!("signal: {signal}"))
    }

    /// The process ended without an exit status of its own (it could not be waited for).
    pub fn failed(message: impl Into<String>) -> EndEvent {
        let message = message.into();
        EndEvent {
            exit_code: -1,
            exited: false,
            error: Some(message.clone()),
            status: message,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// filesystem.Filesystem

/// `Stat`, `MakeDir` and `Remove`. A relative path resolves against the user's home.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathRequest {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListDirRequest {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Absent means 1 (the directory's own entries), which is what the SDK always asks for
    /// at least.
    #[serde(skip_serializing_if = "is_zero")]
    pub depth: u32,
}

impl Default for ListDirRequest {
    fn default() -> Self {
        ListDirRequest {
            path: String::new(),
            depth: 1,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MoveRequest {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub destination: String,
}

/// `WatchDir` and `CreateWatcher`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchDirRequest {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub recursive: bool,
    #[serde(skip_serializing_if = "is_zero")]
    pub include_entry: bool,
    #[serde(skip_serializing_if = "is_zero")]
    pub allow_network_mounts: bool,
}

/// `GetWatcherEvents` and `RemoveWatcher`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherIdRequest {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub watcher_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub watcher_id: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[default]
    #[serde(rename = "EVENT_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FilesystemEvent {
    /// The path relative to the watched directory.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(rename = "type", skip_serializing_if = "is_zero")]
    pub r#type: EventType,
    /// The `EntryInfo`, already in protojson form, when `includeEntry` was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<serde_json::Value>,
}

/// The SDK tolerates a missing `events` (protojson omits an empty list) and reads it as none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetWatcherEventsResponse {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<FilesystemEvent>,
}

/// One message of a `WatchDir` stream (no `event` wrapper, unlike the process streams):
/// `{"start":{}}` first, then `{"filesystem":{…}}` and `{"keepalive":{}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchDirResponse {
    Start(Empty),
    Filesystem(FilesystemEvent),
    Keepalive(Empty),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envd::connect::message;
    use serde_json::json;

    fn json_of<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn start_stream_matches_the_capture() {
        // SANDBOX-PROTOCOL.md §5.3, the response bytes the SDK accepted.
        let mut wire = Vec::new();
        for event in [
            ProcessEvent::start(4242),
            ProcessEvent::stdout(b"hi\n".to_vec()),
            ProcessEvent::end(EndEvent::exited(0)),
        ] {
            wire.extend_from_slice(&message(&event));
        }
        wire.extend_from_slice(&crate::envd::connect::end_stream_ok());
        let mut expected = b"\x00\x00\x00\x00\x20{\"event\":{\"start\":{\"pid\":4242}}}".to_vec();
        expected
            .extend_from_slice(b"\x00\x00\x00\x00\x24{\"event\":{\"data\":{\"stdout\":\"aGkK\"}}}");
        expected.extend_from_slice(
            b"\x00\x00\x00\x00\x3a{\"event\":{\"end\":{\"exited\":true,\"status\":\"exit status 0\"}}}",
        );
        expected.extend_from_slice(b"\x02\x00\x00\x00\x02{}");
        assert_eq!(wire, expected);
    }

    #[test]
    fn other_events() {
        assert_eq!(
            json_of(&ProcessEvent::stderr(b"x".to_vec())),
            r#"{"event":{"data":{"stderr":"eA=="}}}"#
        );
        assert_eq!(
            json_of(&ProcessEvent::pty(b"ls\n".to_vec())),
            r#"{"event":{"data":{"pty":"bHMK"}}}"#
        );
        assert_eq!(
            json_of(&ProcessEvent::keepalive()),
            r#"{"event":{"keepalive":{}}}"#
        );
        assert_eq!(
            json_of(&ProcessEvent::end(EndEvent::exited(3))),
            r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}"#
        );
        assert_eq!(
            json_of(&ProcessEvent::end(EndEvent::signaled("killed"))),
            r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}}"#
        );
        assert_eq!(
            json_of(&EndEvent::failed("lost")),
            r#"{"exitCode":-1,"status":"lost","error":"lost"}"#
        );
        assert!(ProcessEvent::end(EndEvent::exited(0)).is_end());
    }

    #[test]
    fn start_requests_decode() {
        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}"#,
        )
        .unwrap();
        assert_eq!(r.process.cmd, "/bin/bash");
        assert_eq!(r.process.args, ["-l", "-c", "echo hi"]);
        assert_eq!((r.stdin, r.pty, r.process.cwd), (Some(false), None, None));

        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","pwd"],"envs":{"X":"1"},"cwd":"/tmp"},"stdin":false,"newField":1}"#,
        )
        .unwrap();
        assert_eq!(r.process.envs, BTreeMap::from([("X".into(), "1".into())]));
        assert_eq!(r.process.cwd.as_deref(), Some("/tmp"));

        // §5.1, `pty.create(PtySize(24, 80))`: no `stdin` key.
        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm-256color","LANG":"C.UTF-8","LC_ALL":"C.UTF-8"}},"pty":{"size":{"cols":80,"rows":24}}}"#,
        )
        .unwrap();
        assert_eq!(
            r.pty.and_then(|p| p.size),
            Some(PtySize { cols: 80, rows: 24 })
        );
        assert_eq!(r.stdin, None);
        assert_eq!(r.process.envs.len(), 3);
    }

    #[test]
    fn selectors_signals_and_input() {
        let r: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":4246},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(r.process, ProcessSelector::Pid(4246));
        assert_eq!(r.signal, Signal::Sigkill);
        let r: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"tag":"t"},"signal":15}"#).unwrap();
        assert_eq!(
            (r.process, r.signal),
            (ProcessSelector::Tag("t".into()), Signal::Sigterm)
        );
        assert!(serde_json::from_str::<SendSignalRequest>(r#"{"process":{},"signal":9}"#).is_err());
        assert!(serde_json::from_str::<Signal>(r#""SIGNAL_SIGHUP""#).is_err());
        assert_eq!(json_of(&Signal::Sigkill), r#""SIGNAL_SIGKILL""#);
        assert_eq!(json_of(&ProcessSelector::Pid(4242)), r#"{"pid":4242}"#);

        let r: ConnectRequest = serde_json::from_str(r#"{"process":{"pid":4242}}"#).unwrap();
        assert_eq!(r.process, ProcessSelector::Pid(4242));

        let r: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":4243},"input":{"stdin":"aW5wdXQK"}}"#)
                .unwrap();
        assert_eq!(r.input, ProcessInput::Stdin(b"input\n".to_vec()));
        let r: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":4244},"input":{"pty":"bHMK"}}"#).unwrap();
        assert_eq!(r.input, ProcessInput::Pty(b"ls\n".to_vec()));
        assert_eq!(json_of(&r.input), r#"{"pty":"bHMK"}"#);
        assert!(serde_json::from_str::<ProcessInput>(r#"{"stdin":"***"}"#).is_err());

        let r: UpdateRequest = serde_json::from_str(
            r#"{"process":{"pid":4244},"pty":{"size":{"cols":120,"rows":40}}}"#,
        )
        .unwrap();
        assert_eq!(
            r.pty.and_then(|p| p.size),
            Some(PtySize {
                cols: 120,
                rows: 40
            })
        );
        let _: ListRequest = serde_json::from_str("{}").unwrap();
    }

    #[test]
    fn stream_input_events() {
        let parse = |s: &str| serde_json::from_str::<StreamInputRequest>(s).unwrap();
        assert_eq!(
            parse(r#"{"start":{"process":{"pid":4242}}}"#),
            StreamInputRequest::Start {
                process: ProcessSelector::Pid(4242)
            }
        );
        assert_eq!(
            parse(r#"{"data":{"input":{"stdin":"bGluZTEK"}}}"#),
            StreamInputRequest::Data {
                input: ProcessInput::Stdin(b"line1\n".to_vec())
            }
        );
        assert_eq!(parse(r#"{"keepalive":{}}"#), StreamInputRequest::Keepalive);
    }

    #[test]
    fn list_output_omits_defaults() {
        let list = ListResponse {
            processes: vec![ProcessInfo {
                config: ProcessConfig {
                    cmd: "/bin/bash".into(),
                    args: vec!["-l".into()],
                    ..Default::default()
                },
                pid: 4246,
                tag: None,
            }],
        };
        assert_eq!(
            json_of(&list),
            r#"{"processes":[{"config":{"cmd":"/bin/bash","args":["-l"]},"pid":4246}]}"#
        );
        assert_eq!(json_of(&ListResponse::default()), "{}");
    }

    #[test]
    fn filesystem_messages() {
        let r: ListDirRequest = serde_json::from_str(r#"{"path":"/home/user"}"#).unwrap();
        assert_eq!((r.path.as_str(), r.depth), ("/home/user", 1));
        let r: ListDirRequest = serde_json::from_str(r#"{"path":"/home/user","depth":3}"#).unwrap();
        assert_eq!(r.depth, 3);
        let r: MoveRequest = serde_json::from_str(r#"{"source":"a","destination":"b"}"#).unwrap();
        assert_eq!((r.source.as_str(), r.destination.as_str()), ("a", "b"));
        let r: WatchDirRequest =
            serde_json::from_str(r#"{"path":"/home/user","recursive":true,"includeEntry":true}"#)
                .unwrap();
        assert!(r.recursive && r.include_entry && !r.allow_network_mounts);
        let r: WatcherIdRequest = serde_json::from_str(r#"{"watcherId":"w-1"}"#).unwrap();
        assert_eq!(r.watcher_id, "w-1");

        assert_eq!(
            json_of(&CreateWatcherResponse {
                watcher_id: "w-1".into()
            }),
            r#"{"watcherId":"w-1"}"#
        );
        let events = GetWatcherEventsResponse {
            events: vec![FilesystemEvent {
                name: "new.txt".into(),
                r#type: EventType::Create,
                entry: None,
            }],
        };
        assert_eq!(
            serde_json::to_value(&events).unwrap(),
            json!({"events":[{"name":"new.txt","type":"EVENT_TYPE_CREATE"}]})
        );
        assert_eq!(json_of(&GetWatcherEventsResponse::default()), "{}");
        assert_eq!(
            json_of(&WatchDirResponse::Start(Empty {})),
            r#"{"start":{}}"#
        );
    }
}
