//! Gateway access log → the HTTP connection manager's `access_log` (stdout by default, one JSON
//! object per request). The JSON fields are an interface (docs/configuration.md): add, never
//! rename.

use ballast_model::{AccessLogFormat, AccessLogSink, Gateway};
use envoy_types::pb::envoy::config::accesslog::v3::AccessLog;
use envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::StdoutAccessLog;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct, Value};
use prost::{Message, Name};

/// The JSON line's fields and the Envoy command operator each holds.
pub const JSON_FIELDS: &[(&str, &str)] = &[
    ("start_time", "%START_TIME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("status", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration_ms", "%DURATION%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
    ("route", "%ROUTE_NAME%"),
    ("client", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
];

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// `bytes` as a length-delimited field `tag`.
fn field(tag: u32, bytes: &[u8]) -> Vec<u8> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let mut out = Vec::with_capacity(bytes.len() + 8);
    encode_key(tag, WireType::LengthDelimited, &mut out);
    encode_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// The encoded `SubstitutionFormatString` of the JSON line. `Struct` is a protobuf map (a
/// `HashMap` in prost, encoded in random order), so it is encoded here entry by entry in field
/// order: translation stays byte-for-byte deterministic (resource versions hash the bytes).
fn json_format(gw: &Gateway) -> Vec<u8> {
    let mut fields: Vec<(String, String)> = JSON_FIELDS
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    fields.push(("gateway".into(), gw.key().to_string()));
    fields.sort();
    let mut entries = Vec::new();
    for (k, v) in fields {
        // A one-entry Struct encodes as exactly that map entry; concatenated entries are the map.
        entries.extend(
            Struct {
                fields: [(k, string(&v))].into_iter().collect(),
            }
            .encode_to_vec(),
        );
    }
    // SubstitutionFormatString.json_format = 2.
    field(2, &entries)
}

/// The access loggers of `gw`'s HTTP connection managers.
pub(crate) fn access_logs(gw: &Gateway) -> Vec<AccessLog> {
    let cfg = gw.access_log();
    let json = (cfg.format == AccessLogFormat::Json).then(|| json_format(gw));
    let any = |type_url: String, mut value: Vec<u8>, format_tag: u32| {
        if let Some(j) = &json {
            value.extend(field(format_tag, j));
        }
        Any { type_url, value }
    };
    let url = |name: String| format!("type.googleapis.com/{name}");
    match cfg.sink {
        AccessLogSink::Off => Vec::new(),
        // StdoutAccessLog.log_format = 1.
        AccessLogSink::Stdout => vec![AccessLog {
            name: "envoy.access_loggers.stdout".into(),
            config_type: Some(ConfigType::TypedConfig(any(
                url(StdoutAccessLog::full_name()),
                Vec::new(),
                1,
            ))),
            ..Default::default()
        }],
        // FileAccessLog.log_format = 5.
        AccessLogSink::File(path) => vec![AccessLog {
            name: "envoy.access_loggers.file".into(),
            config_type: Some(ConfigType::TypedConfig(any(
                url(FileAccessLog::full_name()),
                FileAccessLog {
                    path,
                    access_log_format: None,
                }
                .encode_to_vec(),
                5,
            ))),
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format;
    use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::stdout_access_log::AccessLogFormat as StdoutFormat;

    #[test]
    fn json_line_decodes_and_encodes_deterministically() {
        let set = crate::tests::config(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners: [{ name: http, port: 80, protocol: HTTP }]\n",
        );
        let gw = &set.gateways[&crate::tests::gw("edge")];
        let a = access_logs(gw);
        assert_eq!(a, access_logs(gw), "same bytes every time");
        let Some(ConfigType::TypedConfig(any)) = &a[0].config_type else {
            panic!()
        };
        let log = StdoutAccessLog::decode(any.value.as_slice()).unwrap();
        let Some(StdoutFormat::LogFormat(f)) = log.access_log_format else {
            panic!()
        };
        let Some(Format::JsonFormat(s)) = f.format else {
            panic!()
        };
        assert_eq!(s.fields.len(), JSON_FIELDS.len() + 1);
        assert_eq!(
            s.fields["gateway"].kind,
            Some(Kind::StringValue("default/edge".into()))
        );
        assert_eq!(
            s.fields["status"].kind,
            Some(Kind::StringValue("%RESPONSE_CODE%".into()))
        );
    }
}
