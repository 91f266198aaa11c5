//! Intentionally empty: this package exists for `tests/readme.rs`, which
//! embeds `ballast-xds` the way its README shows, built with one feature set
//! at a time (`default`, `rest`, `csds`, `tls`). `ballast-xds`'s own tests
//! cannot do that because its self dev-dependency enables every feature.
