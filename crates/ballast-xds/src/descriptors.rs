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

/// The descriptor pool of every Envoy API message (decoded on first use).
pub(crate) fn pool() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
        tracing::debug!("decoding the full Envoy descriptor set");
        DescriptorPool::decode(FULL).expect("bundled descriptor set is valid")
    });
    &POOL
}

/// The pool of the served types and the typed_config types Ballast emits.
pub(crate) fn served() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
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
