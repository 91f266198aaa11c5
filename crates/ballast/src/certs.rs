//! `ballast certs`: a development CA and certificates for mTLS between Envoy
//! and the xDS port (rcgen, ECDSA P-256). For production use certificates
//! from your own PKI (cert-manager, SPIRE): the file layout below is all
//! `ballast bootstrap --tls-dir` and `ballast serve --xds-tls-*` need.
//!
//! Layout of DIR: `ca.pem`, `ca-key.pem` (the CA), `server.pem`,
//! `server-key.pem` (the xDS port), `gateway-<ns>-<name>.pem` and
//! `gateway-<ns>-<name>-key.pem` (one Envoy client per gateway).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

pub const CA: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const SERVER: &str = "server.pem";
pub const SERVER_KEY: &str = "server-key.pem";

/// File names of a gateway's client certificate and key in DIR.
pub fn gateway_files(dir: &Path, ns: &str, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("gateway-{ns}-{name}.pem")),
        dir.join(format!("gateway-{ns}-{name}-key.pem")),
    )
}

/// The SPIFFE ID the default authorization rule maps to gateway `ns/name`.
pub fn spiffe_id(trust_domain: &str, ns: &str, name: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{ns}/gw/{name}")
}

fn write(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let _ = private;
    // Written beside and renamed: a server re-reading the files never sees half of one.
    let tmp = path.with_extension("tmp");
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(days.into());
}

/// Creates a CA and a server certificate for the xDS port in `dir`.
pub fn init(dir: &Path, server_names: &[String], days: u32) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if dir.join(CA).exists() {
        bail!(
            "{} exists: refusing to replace a CA (every certificate it signed would stop working); remove it first",
            dir.join(CA).display()
        );
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Ballast development CA");
    params.distinguished_name = dn;
    validity(&mut params, days.max(3650));
    let cert = params.self_signed(&key)?;
    write(&dir.join(CA), &cert.pem(), false)?;
    write(&dir.join(CA_KEY), &key.serialize_pem(), true)?;
    server(dir, server_names, days)
}

fn issuer(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let ca_pem = std::fs::read_to_string(dir.join(CA)).with_context(|| {
        format!(
            "reading {} (run `ballast certs init` first)",
            dir.join(CA).display()
        )
    })?;
    let key_pem = std::fs::read_to_string(dir.join(CA_KEY))
        .with_context(|| format!("reading {}", dir.join(CA_KEY).display()))?;
    let key = KeyPair::from_pem(&key_pem)
        .with_context(|| format!("{}: not a private key", dir.join(CA_KEY).display()))?;
    Issuer::from_ca_cert_pem(&ca_pem, key)
        .with_context(|| format!("{}: not a CA certificate", dir.join(CA).display()))
}

/// (Re)issues the xDS port's server certificate (also for rotation).
pub fn server(dir: &Path, names: &[String], days: u32) -> anyhow::Result<()> {
    let issuer = issuer(dir)?;
    let mut sans = vec![
        SanType::DnsName("localhost".try_into()?),
        SanType::IpAddress([127, 0, 0, 1].into()),
        SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
    ];
    for n in names {
        sans.push(match n.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(n.as_str().try_into()?),
        });
    }
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    params
        .distinguished_name
        .push(DnType::CommonName, "ballast xds");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write(&dir.join(SERVER), &cert.pem(), false)?;
    write(&dir.join(SERVER_KEY), &key.serialize_pem(), true)?;
    Ok(())
}

/// Issues a client certificate for the Envoys of gateway `ns/name`, with the
/// SPIFFE ID the default rule maps to that gateway (or `identity`).
pub fn issue(
    dir: &Path,
    ns: &str,
    name: &str,
    trust_domain: &str,
    identity: Option<&str>,
    days: u32,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let issuer = issuer(dir)?;
    let uri = identity
        .map(str::to_string)
        .unwrap_or_else(|| spiffe_id(trust_domain, ns, name));
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![SanType::URI(uri.as_str().try_into()?)];
    params
        .distinguished_name
        .push(DnType::CommonName, format!("gateway {ns}/{name}"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params, days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let (cert_path, key_path) = gateway_files(dir, ns, name);
    write(&cert_path, &cert.pem(), false)?;
    write(&key_path, &key.serialize_pem(), true)?;
    Ok((cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_xds::security::PeerIdentity;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn issued_client_carries_the_spiffe_id_and_init_keeps_a_ca() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &["xds.example".into()], 30).unwrap();
        let (c, k) = issue(dir.path(), "default", "edge", "ballast.local", None, 30).unwrap();
        let der = CertificateDer::from_pem_file(&c).unwrap();
        let id = PeerIdentity::from_der(&der).unwrap();
        assert_eq!(id.uris, vec!["spiffe://ballast.local/ns/default/gw/edge"]);
        assert!(std::fs::read_to_string(k).unwrap().contains("PRIVATE KEY"));
        let server = PeerIdentity::from_der(
            &CertificateDer::from_pem_file(dir.path().join(SERVER)).unwrap(),
        )
        .unwrap();
        assert!(
            server.dns.contains(&"xds.example".to_string()),
            "{server:?}"
        );
        let e = init(dir.path(), &[], 30).unwrap_err().to_string();
        assert!(e.contains("refusing to replace a CA"), "{e}");
    }
}
