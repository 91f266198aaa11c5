//! `ballast bootstrap`: an Envoy bootstrap that connects to this server and
//! serves one gateway.

use std::net::SocketAddr;
use std::path::PathBuf;

pub struct BootstrapOptions {
    pub gateway: String,
    pub node_id: Option<String>,
    pub xds_addr: SocketAddr,
    pub transport: Transport,
    pub envoy_admin_port: u16,
    /// mTLS to the xDS port with the files of `ballast certs` in this directory.
    pub tls_dir: Option<PathBuf>,
}

/// The xDS cluster's `transport_socket` for mTLS: the gateway's client
/// certificate and key, and the CA that signed the server's certificate.
/// Paths are made absolute (Envoy resolves them from its own working dir).
pub fn tls_transport_socket(dir: &std::path::Path, gateway: &str) -> anyhow::Result<String> {
    let dir = std::path::absolute(dir)?;
    let (ns, name) = gateway.split_once('/').unwrap_or(("default", gateway));
    let (cert, key) = crate::certs::gateway_files(&dir, ns, name);
    let ca = dir.join(crate::certs::CA);
    for f in [&cert, &key, &ca] {
        if !f.exists() {
            anyhow::bail!(
                "{} is missing: run `ballast certs init {d}` and `ballast certs issue --gateway {ns}/{name} {d}` (or put your own files there)",
                f.display(),
                d = dir.display()
            );
        }
    }
    Ok(format!(
        r#"    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates:
          - certificate_chain: {{ filename: "{cert}" }}
            private_key: {{ filename: "{key}" }}
          validation_context:
            trusted_ca: {{ filename: "{ca}" }}
"#,
        cert = cert.display(),
        key = key.display(),
        ca = ca.display(),
    ))
}

/// How the Envoy fetches its clusters and listeners.
///
/// Translated clusters, listeners and TLS contexts fetch their endpoints,
/// routes and secrets with `ads: {}`. Envoy 1.40 rejects `self: {}` on every
/// transport ("Missing config source specifier in ConfigSource", measured
/// with tests/transports.rs) and per-type/REST Envoys without ADS reject
/// `ads: {}` ("ADS must be configured to support an ADS config source"), so one snapshot per gateway stays valid for all
/// transports only if every bootstrap configures ADS: the per-type and REST
/// bootstraps fetch CDS and LDS their own way and EDS/RDS/SDS over ADS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Everything over one Aggregated Discovery Service stream, State of the World.
    #[default]
    Ads,
    /// Everything over one ADS stream, incremental (Delta) xDS.
    DeltaAds,
    /// CDS and LDS on their own gRPC streams (SotW); EDS/RDS/SDS over ADS.
    Grpc,
    /// CDS and LDS on their own Delta gRPC streams; EDS/RDS/SDS over Delta ADS.
    DeltaGrpc,
    /// CDS and LDS by REST-JSON polling every second; EDS/RDS/SDS over ADS.
    Rest,
}

/// `dynamic_resources` for `t`, indented for the bootstrap below.
fn dynamic_resources(t: Transport) -> String {
    let delta = matches!(t, Transport::DeltaAds | Transport::DeltaGrpc);
    let api = if delta { "DELTA_GRPC" } else { "GRPC" };
    let ads = format!(
        r#"  ads_config:
    api_type: {api}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: {{ cluster_name: ballast_xds }}
"#
    );
    let source = match t {
        Transport::Ads | Transport::DeltaAds => {
            return format!(
                "{ads}  cds_config: {{ ads: {{}}, resource_api_version: V3 }}\n  lds_config: {{ ads: {{}}, resource_api_version: V3 }}\n"
            );
        }
        Transport::Grpc | Transport::DeltaGrpc => format!(
            "{{ api_type: {api}, transport_api_version: V3, set_node_on_first_message_only: true, grpc_services: [{{ envoy_grpc: {{ cluster_name: ballast_xds }} }}] }}"
        ),
        // A poll is answered at once (200 with news, 304 without), so the
        // timeout only bounds a hung server; the delay is the update latency.
        Transport::Rest => "{ api_type: REST, transport_api_version: V3, cluster_names: [ballast_xds], refresh_delay: 1s, request_timeout: 5s }".to_string(),
    };
    format!(
        "{ads}  cds_config:\n    resource_api_version: V3\n    api_config_source: {source}\n  lds_config:\n    resource_api_version: V3\n    api_config_source: {source}\n"
    )
}

pub fn render(o: &BootstrapOptions) -> anyhow::Result<String> {
    let tls = match &o.tls_dir {
        Some(dir) => tls_transport_socket(dir, &o.gateway)?,
        None => String::new(),
    };
    let node_id = o
        .node_id
        .clone()
        .unwrap_or_else(|| format!("envoy-{}", o.gateway.replace('/', "-")));
    let dynamic = dynamic_resources(o.transport);
    Ok(format!(
        r#"# Envoy bootstrap for gateway {gw}, generated by `ballast bootstrap`.
node:
  id: {node_id}
  cluster: {gw}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
dynamic_resources:
{dynamic}static_resources:
  clusters:
  - name: ballast_xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            connection_keepalive: {{ interval: 30s, timeout: 10s }}
{tls}    load_assignment:
      cluster_name: ballast_xds
      endpoints:
      - lb_endpoints:
        - endpoint:
            address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }}
"#,
        gw = o.gateway,
        admin = o.envoy_admin_port,
        ip = o.xds_addr.ip(),
        port = o.xds_addr.port(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_dir_names_missing_files_and_uses_absolute_paths() {
        let dir = tempfile::tempdir().unwrap();
        let e = tls_transport_socket(dir.path(), "default/edge")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gateway-default-edge.pem is missing") && e.contains("ballast certs issue"),
            "{e}"
        );
        crate::certs::init(dir.path(), &[], 1).unwrap();
        crate::certs::issue(dir.path(), "default", "edge", "ballast.local", None, 1).unwrap();
        let yaml = tls_transport_socket(dir.path(), "default/edge").unwrap();
        let abs = std::path::absolute(dir.path()).unwrap();
        for f in [
            "gateway-default-edge.pem",
            "gateway-default-edge-key.pem",
            "ca.pem",
        ] {
            assert!(yaml.contains(&abs.join(f).display().to_string()), "{yaml}");
        }
        assert!(yaml.contains("UpstreamTlsContext"), "{yaml}");
    }

    fn opts(transport: Transport) -> BootstrapOptions {
        BootstrapOptions {
            gateway: "default/edge".into(),
            node_id: None,
            xds_addr: "127.0.0.1:18000".parse().unwrap(),
            transport,
            envoy_admin_port: 9901,
            tls_dir: None,
        }
    }

    /// The default (ADS) bootstrap is exactly what it was before transports existed.
    #[test]
    fn ads_bootstrap_is_unchanged() {
        let y = render(&opts(Transport::Ads)).unwrap();
        let expected = "dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: { cluster_name: ballast_xds }
  cds_config: { ads: {}, resource_api_version: V3 }
  lds_config: { ads: {}, resource_api_version: V3 }
static_resources:";
        assert!(y.contains(expected), "{y}");
        let d = render(&opts(Transport::DeltaAds)).unwrap();
        assert_eq!(d, y.replace("api_type: GRPC", "api_type: DELTA_GRPC"));
    }

    /// Per-type and REST bootstraps still configure ADS (for the `ads: {}`
    /// EDS/RDS/SDS references) but fetch CDS and LDS their own way.
    #[test]
    fn per_type_and_rest_fetch_cds_and_lds_their_own_way() {
        for (t, api) in [
            (Transport::Grpc, "api_type: GRPC,"),
            (Transport::DeltaGrpc, "api_type: DELTA_GRPC,"),
            (Transport::Rest, "api_type: REST,"),
        ] {
            let y = render(&opts(t)).unwrap();
            assert!(y.contains("  ads_config:\n"), "{t:?}: {y}");
            assert_eq!(y.matches("api_config_source: {").count(), 2, "{t:?}: {y}");
            assert_eq!(y.matches(api).count(), 2, "{t:?}: {y}");
            assert!(!y.contains("cds_config: { ads"), "{t:?}: {y}");
        }
        let rest = render(&opts(Transport::Rest)).unwrap();
        assert!(
            rest.contains("refresh_delay: 1s, request_timeout: 5s"),
            "{rest}"
        );
        assert!(rest.contains("cluster_names: [ballast_xds]"), "{rest}");
    }
}
