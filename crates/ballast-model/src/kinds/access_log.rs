//! Per-Gateway access log settings, as Gateway annotations (so the manifest stays a valid
//! Gateway API object in a cluster): `ballast.dev/access-log` (`stdout`, the default; `off`; or an
//! absolute file path) and `ballast.dev/access-log-format` (`json`, the default: one JSON object
//! per request with the fields of docs/configuration.md; or `text`: Envoy's default line).

use super::Gateway;

pub const ACCESS_LOG_ANNOTATION: &str = "ballast.dev/access-log";
pub const ACCESS_LOG_FORMAT_ANNOTATION: &str = "ballast.dev/access-log-format";

/// Where a Gateway's access log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessLogSink {
    Stdout,
    File(String),
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLogFormat {
    Json,
    Text,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLog {
    pub sink: AccessLogSink,
    pub format: AccessLogFormat,
}

/// Parses the sink annotation's value.
pub fn parse_sink(v: &str) -> Result<AccessLogSink, String> {
    match v {
        "stdout" => Ok(AccessLogSink::Stdout),
        "off" => Ok(AccessLogSink::Off),
        p if p.starts_with('/') && !p.contains('\0') => Ok(AccessLogSink::File(p.to_owned())),
        other => Err(format!(
            "{ACCESS_LOG_ANNOTATION} {other:?} must be `stdout`, `off` or an absolute file path"
        )),
    }
}

pub fn parse_format(v: &str) -> Result<AccessLogFormat, String> {
    match v {
        "json" => Ok(AccessLogFormat::Json),
        "text" => Ok(AccessLogFormat::Text),
        other => Err(format!(
            "{ACCESS_LOG_FORMAT_ANNOTATION} {other:?} must be `json` or `text`"
        )),
    }
}

impl Gateway {
    /// The Gateway's access log (validated at parse time; invalid values cannot reach here).
    pub fn access_log(&self) -> AccessLog {
        let a = &self.metadata.annotations;
        AccessLog {
            sink: a
                .get(ACCESS_LOG_ANNOTATION)
                .and_then(|v| parse_sink(v).ok())
                .unwrap_or(AccessLogSink::Stdout),
            format: a
                .get(ACCESS_LOG_FORMAT_ANNOTATION)
                .and_then(|v| parse_format(v).ok())
                .unwrap_or(AccessLogFormat::Json),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(annotations: &str) -> Result<Vec<crate::Object>, crate::ConfigErrors> {
        crate::parse_file(
            "gw.yaml",
            &format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: edge\n  annotations: {{ {annotations} }}\nspec:\n  gatewayClassName: ballast\n  listeners: [{{ name: http, port: 80, protocol: HTTP }}]\n"
            ),
        )
    }

    #[test]
    fn annotations_select_sink_and_format() {
        let access_log = |a: &str| match &gateway(a).unwrap()[0] {
            crate::Object::Gateway(g) => g.access_log(),
            _ => unreachable!(),
        };
        assert_eq!(
            access_log(""),
            AccessLog {
                sink: AccessLogSink::Stdout,
                format: AccessLogFormat::Json
            }
        );
        assert_eq!(
            access_log(
                "ballast.dev/access-log: /var/log/a.log, ballast.dev/access-log-format: text"
            ),
            AccessLog {
                sink: AccessLogSink::File("/var/log/a.log".into()),
                format: AccessLogFormat::Text
            }
        );
        assert_eq!(
            access_log("ballast.dev/access-log: off").sink,
            AccessLogSink::Off
        );
        let e = gateway("ballast.dev/access-log: logs/a.log").unwrap_err();
        assert!(
            e[0].to_string().contains(
                "metadata.annotations[ballast.dev/access-log]: ballast.dev/access-log \"logs/a.log\" must be"
            ),
            "{e:?}"
        );
        assert!(gateway("ballast.dev/access-log-format: xml").is_err());
    }
}
