//! A small ES256 (ECDSA P-256) JWT signer for authentication tests: a fresh key pair, its
//! JWKS as Envoy's `jwt_authn` reads it, and compact tokens for any claims. Built on ring,
//! which the tree already has for rustls; no JWT library needed for one algorithm.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

/// One signing key with a key id.
pub struct JwtSigner {
    key: EcdsaKeyPair,
    kid: String,
    rng: SystemRandom,
}

impl JwtSigner {
    /// A new random P-256 key named `kid`.
    pub fn generate(kid: &str) -> JwtSigner {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generate P-256 key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("parse generated key");
        JwtSigner {
            key,
            kid: kid.to_owned(),
            rng,
        }
    }

    /// The public key as a JSON Web Key Set (one `EC` key).
    pub fn jwks(&self) -> String {
        // Uncompressed point: 0x04 || x (32 bytes) || y (32 bytes).
        let point = self.key.public_key().as_ref();
        serde_json::json!({
            "keys": [{
                "kty": "EC",
                "crv": "P-256",
                "alg": "ES256",
                "use": "sig",
                "kid": self.kid,
                "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
            }]
        })
        .to_string()
    }

    /// A compact JWS of `claims` signed with this key.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let header = serde_json::json!({ "alg": "ES256", "typ": "JWT", "kid": self.kid });
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .expect("sign JWT");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }
}

/// Seconds since the Unix epoch (for `exp`/`iat` claims).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_verifies_with_the_public_key() {
        let s = JwtSigner::generate("k1");
        let t = s.sign(&serde_json::json!({ "sub": "alice" }));
        let parts: Vec<&str> = t.split('.').collect();
        assert_eq!(parts.len(), 3);
        let pk = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            s.key.public_key().as_ref().to_vec(),
        );
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        pk.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
            .unwrap();
        let jwks: serde_json::Value = serde_json::from_str(&s.jwks()).unwrap();
        assert_eq!(jwks["keys"][0]["kid"], "k1");
    }
}
