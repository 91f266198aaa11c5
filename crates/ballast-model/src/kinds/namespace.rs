//! `v1` `Namespace`: only its labels matter, for Gateway listeners whose
//! `allowedRoutes.namespaces.from: Selector` admits routes by their namespace's labels. A
//! namespace without a `Namespace` object has no labels.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Metadata, Source, object_kind};
use crate::spanned::Spanned;

#[derive(Clone, Debug)]
pub struct Namespace {
    pub metadata: Metadata,
    pub spec: NamespaceSpec,
    pub source: Source,
}
object_kind!(Namespace, super::Kind::Namespace);

/// Accepted for Kubernetes compatibility (`finalizers`), unused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSpec {
    #[serde(default)]
    pub finalizers: Vec<String>,
}

/// A Kubernetes label selector: every `matchLabels` entry and every expression must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: Spanned<SelectorOperator>,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let v = labels.get(&e.key);
                match *e.operator {
                    SelectorOperator::In => v.is_some_and(|v| e.values.contains(v)),
                    SelectorOperator::NotIn => v.is_none_or(|v| !e.values.contains(v)),
                    SelectorOperator::Exists => v.is_some(),
                    SelectorOperator::DoesNotExist => v.is_none(),
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use crate::status::compute;
    use crate::{ConfigSet, ObjectKey, parse_file};

    fn config(selector: &str, namespaces: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: edge }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - name: http\n    port: 80\n    protocol: HTTP\n    allowedRoutes: {{ namespaces: {{ from: Selector, selector: {selector} }} }}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r, namespace: team-a }}\nspec:\n  parentRefs: [{{ name: edge, namespace: default }}]\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r, namespace: team-b }}\nspec:\n  parentRefs: [{{ name: edge, namespace: default }}]\n{namespaces}"
        )
    }

    const NAMESPACES: &str = "---\napiVersion: v1\nkind: Namespace\nmetadata: { name: team-a, labels: { shared-gateway: \"true\", env: prod } }\n\
        ---\napiVersion: v1\nkind: Namespace\nmetadata: { name: team-b, labels: { env: dev } }\n";

    /// Which of team-a/r and team-b/r attach.
    fn attached(selector: &str, namespaces: &str) -> Vec<String> {
        let set = ConfigSet::build([("c.yaml", config(selector, namespaces))]).unwrap();
        set.attached_routes(&ObjectKey::new("default", "edge"))
            .iter()
            .map(|a| a.route.metadata.namespace.clone())
            .collect()
    }

    /// `from: Selector` admits routes whose namespace's labels (from `Namespace` objects) match;
    /// a namespace without an object has no labels.
    #[test]
    fn selector_admits_routes_by_namespace_labels() {
        let labels = "{ matchLabels: { shared-gateway: \"true\" } }";
        assert_eq!(attached(labels, NAMESPACES), ["team-a"]);
        assert!(attached(labels, "").is_empty());
        let expr = |op: &str, values: &str| {
            format!("{{ matchExpressions: [{{ key: env, operator: {op}, values: [{values}] }}] }}")
        };
        assert_eq!(
            attached(&expr("In", "prod, dev"), NAMESPACES),
            ["team-a", "team-b"]
        );
        assert_eq!(attached(&expr("NotIn", "prod"), NAMESPACES), ["team-b"]);
        assert_eq!(
            attached(&expr("Exists", ""), NAMESPACES),
            ["team-a", "team-b"]
        );
        assert!(attached(&expr("DoesNotExist", ""), NAMESPACES).is_empty());
        assert_eq!(
            attached("{}", NAMESPACES),
            ["team-a", "team-b"],
            "empty selector: all"
        );
        let set = ConfigSet::build([("c.yaml", config(labels, NAMESPACES))]).unwrap();
        let s = compute(&set);
        let b = s
            .http_routes
            .iter()
            .find(|r| r.namespace == "team-b")
            .unwrap();
        assert_eq!(b.parents[0].conditions[0].reason, "NotAllowedByListeners");
    }

    #[test]
    fn selector_and_namespace_validation() {
        let errs = |text: &str| -> Vec<String> {
            parse_file("c.yaml", text)
                .unwrap_err()
                .iter()
                .map(|e| e.to_string())
                .collect()
        };
        let no_selector = config("{}", "").replace(", selector: {}", "");
        assert!(
            errs(&no_selector)[0]
                .contains("allowedRoutes.namespaces.selector: from: Selector needs a selector")
        );
        let same = config("{}", "").replace("from: Selector", "from: Same");
        assert!(errs(&same)[0].contains("selector is only used with from: Selector"));
        let scoped = "apiVersion: v1\nkind: Namespace\nmetadata: { name: a, namespace: b }\n";
        assert!(errs(scoped)[0].contains("a Namespace is cluster-scoped"));
        let bad_op = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: g }\nspec:\n  gatewayClassName: x\n  listeners: [{ name: h, port: 80, protocol: HTTP, allowedRoutes: { namespaces: { from: Selector, selector: { matchExpressions: [{ key: a, operator: Is }] } } } }]\n";
        assert!(
            errs(bad_op)[0].contains("unknown variant `Is`"),
            "{:?}",
            errs(bad_op)
        );
        // kubectl output (status, spec.finalizers) loads.
        let kubectl = "apiVersion: v1\nkind: Namespace\nmetadata: { name: a, labels: { x: y } }\nspec: { finalizers: [kubernetes] }\nstatus: { phase: Active }\n";
        assert_eq!(parse_file("n.yaml", kubectl).unwrap().len(), 1);
    }
}
