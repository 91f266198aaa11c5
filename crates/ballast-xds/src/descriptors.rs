//! The descriptor sets of the Envoy API, as generated from the same protos
//! `envoy-types` was built from (which is why `envoy-types` is pinned to
//! that exact version). Always compiled in: canonical content versions walk
//! `map` fields by descriptor so equal content hashes equally whatever the
//! `HashMap` order (see `crate::version`); the `rest` feature also uses it for
//! proto-JSON.
//!
//! Two pools, because decoding the whole API costs ~35 MiB resident (issue
//! 15): the *served* pool holds only the files the served resource types and
//! the typed_config payloads Ballast emits need (`descriptors/served-types.txt`,
//! cut by `build.rs`), and is what every lookup tries first. The *full* pool is
//! decoded only when a lookup misses (a library user's own extension type), so
//! nothing ever fails for want of a descriptor.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, MessageDescriptor};

static FULL: &[u8] = include_bytes!("../descriptors/envoy-types-0.7.7.bin");
static SERVED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/served.bin"));

/// How many descriptor pools this process decoded (tests: serving and
/// versioning resources must not need one).
#[cfg(test)]
static DECODED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn decoding() {
    #[cfg(test)]
    DECODED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// The descriptor pool of every Envoy API message (decoded on first use).
pub(crate) fn pool() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
        tracing::debug!("decoding the full Envoy descriptor set");
        decoding();
        DescriptorPool::decode(FULL).expect("bundled descriptor set is valid")
    });
    &POOL
}

/// The pool of the served types and the typed_config types Ballast emits.
pub(crate) fn served() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
        decoding();
        DescriptorPool::decode(SERVED).expect("build.rs writes a valid descriptor subset")
    });
    &POOL
}

/// `full_name`'s descriptor: from the served pool, else from the full one.
pub(crate) fn message(full_name: &str) -> Option<MessageDescriptor> {
    served()
        .get_message_by_name(full_name)
        .or_else(|| pool().get_message_by_name(full_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResourceType;

    /// Building and versioning resources, maps and `Any`s included, decodes
    /// no descriptor pool (issue #13: the served pool was ~11 MB of every
    /// process's heap from its first resource on). Runs in a child process of
    /// this test binary, where no other test can have decoded one first.
    #[test]
    fn resources_are_versioned_without_a_descriptor_pool() {
        const CHILD: &str = "BALLAST_XDS_TEST_NO_POOL_CHILD";
        let name = "descriptors::tests::resources_are_versioned_without_a_descriptor_pool";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("1 passed"), "the child ran the test: {text}");
            return;
        }
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
        use prost::{Message, Name};
        let st = Struct {
            fields: (0..4)
                .map(|i| {
                    (
                        format!("k{i}"),
                        Value {
                            kind: Some(Kind::NumberValue(i.into())),
                        },
                    )
                })
                .collect(),
        };
        let mut md = Metadata::default();
        for i in 0..4 {
            md.filter_metadata.insert(format!("f{i}"), st.clone());
            md.typed_filter_metadata.insert(
                format!("t{i}"),
                Any {
                    type_url: Struct::type_url(),
                    value: st.encode_to_vec(),
                },
            );
        }
        let c = Cluster {
            name: "c".into(),
            metadata: Some(md),
            ..Default::default()
        };
        let r = crate::Resource::new(&c).unwrap();
        assert!(!r.version().is_empty());
        assert_eq!(DECODED.load(std::sync::atomic::Ordering::SeqCst), 0);
        // The counter counts: proto-JSON does decode.
        let _ = served();
        assert_eq!(DECODED.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn served_pool_holds_every_resource_type_and_is_small() {
        for ty in ResourceType::ALL {
            let name = ty.type_url().rsplit('/').next().unwrap();
            assert!(served().get_message_by_name(name).is_some(), "{name}");
        }
        assert!(
            SERVED.len() * 2 < FULL.len(),
            "served {} of {} bytes",
            SERVED.len(),
            FULL.len()
        );
        // Not served, still found (from the full set).
        let other = "envoy.extensions.filters.http.buffer.v3.Buffer";
        assert!(served().get_message_by_name(other).is_none());
        assert_eq!(message(other).unwrap().full_name(), other);
    }
}
