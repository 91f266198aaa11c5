//! Times translation of a generated config: N HTTPRoutes with distinct hostnames, each with its
//! own Backend, on one Gateway. `cargo run --release -p ballast-translate --example
//! translate_bench -- [N]` (default 3400). Prints medians of a few runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_model::{ConfigSet, ObjectKey};
use ballast_translate::{Options, Translator, translate_gateway};

fn generate(n: usize, port_of: impl Fn(usize) -> u32, host_suffix: &str) -> String {
    let mut s = String::from(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - { name: http, port: 10000, protocol: HTTP }\n",
    );
    for i in 0..n {
        s.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r{i} }}\nspec:\n  parentRefs: [{{ name: edge }}]\n  hostnames: [h{i}.{host_suffix}]\n  rules:\n  - matches: [{{ path: {{ type: PathPrefix, value: / }} }}]\n    backendRefs: [{{ name: b{i} }}]\n---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: b{i} }}\nspec:\n  endpoints:\n  - {{ address: 127.0.0.1, port: {} }}\n  - {{ address: 127.0.0.2, port: {} }}\n",
            port_of(i),
            port_of(i)
        ));
    }
    s
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N"))
        .unwrap_or(3400);
    // `translate_bench N profile-route|profile-backend`: only that update, many times (for perf).
    let profile = std::env::args().nth(2);
    let yaml = generate(n, |_| 8080, "example.com");
    let t = Instant::now();
    let set = Arc::new(ConfigSet::build([("gen.yaml", &yaml)]).expect("valid"));
    println!(
        "{n} routes + backends, {} KB YAML; parse {:?}",
        yaml.len() / 1024,
        t.elapsed()
    );
    let gw = ObjectKey::new("default", "edge");
    let opts = Options::default();

    // Two versions of the config differing in one object, applied alternately; only
    // `Translator::update` is timed (not building the next config).
    let edited = |what: &str, toggled: bool| {
        let mut next = (*set).clone();
        if what == "route" {
            let key = ObjectKey::new("default", "r7");
            let mut r = (*next.http_routes[&key]).clone();
            r.spec.hostnames[0].value = if toggled {
                "edited.example.com".into()
            } else {
                "h7.example.com".into()
            };
            next.http_routes.insert(key, Arc::new(r));
        } else {
            let key = ObjectKey::new("default", "b7");
            let mut b = (*next.backends[&key]).clone();
            b.spec.endpoints[0].port.value = if toggled { 9090 } else { 8080 };
            next.backends.insert(key, Arc::new(b));
        }
        Arc::new(next)
    };
    let alternate = |what: &str, runs: usize| {
        let versions = [edited(what, true), edited(what, false)];
        let mut t = Translator::new(opts.clone());
        t.update(&set);
        let mut times = Vec::new();
        let mut stats = None;
        for i in 0..runs {
            let start = Instant::now();
            let out = t.update(&versions[i % 2]);
            times.push(start.elapsed());
            stats = Some(out.stats);
            drop(out);
        }
        (median(times), stats)
    };
    if let Some(p) = profile.as_deref() {
        let what = p.strip_prefix("profile-").unwrap_or(p);
        let (d, _) = alternate(what, 200);
        println!("{p}: {d:?}");
        return;
    }
    let scratch = time(5, || translate_gateway(&set, &gw, &opts).unwrap());
    let res = translate_gateway(&set, &gw, &opts).unwrap();
    let bytes: usize = res.iter().map(|r| r.any_bytes().len()).sum();
    println!(
        "translate_gateway from scratch: {scratch:?} ({} resources, {} KB encoded)",
        res.len(),
        bytes / 1024
    );
    let snap = time(5, || res.snapshot(None).unwrap());
    println!("snapshot build (consistency check): {snap:?}");

    let cold = time(5, || Translator::new(opts.clone()).update(&set));
    println!("Translator::update cold: {cold:?}");

    // One endpoint change (same config otherwise; unchanged objects keep their Arcs).
    let (endpoint, stats) = alternate("backend", 11);
    println!("update, one Backend's endpoints changed: {endpoint:?} {stats:?}");

    // One route edit (hostname change).
    let (route_edit, stats) = alternate("route", 11);
    println!("update, one HTTPRoute edited: {route_edit:?} {stats:?}");
}
