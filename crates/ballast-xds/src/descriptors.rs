//! The descriptor set of the Envoy API, as generated from the same protos
//! `envoy-types` was built from (which is why `envoy-types` is pinned to
//! that exact version). Always compiled in: canonical content versions walk
//! `map` fields by descriptor so equal content hashes equally whatever the
//! `HashMap` order (see `crate::version`); the `rest` feature also uses it for
//! proto-JSON.

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

static DESCRIPTORS: &[u8] = include_bytes!("../descriptors/envoy-types-0.7.7.bin");

/// The descriptor pool of every Envoy API message.
pub(crate) fn pool() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
        DescriptorPool::decode(DESCRIPTORS).expect("bundled descriptor set is valid")
    });
    &POOL
}
