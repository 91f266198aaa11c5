//! Policy attachment (Gateway API GEP-713), shared by every policy kind.
//!
//! A policy names targets (`targetRefs`: kind, name in the policy's namespace, optional
//! `sectionName`). For each target the rules are:
//!
//! - **Most specific wins**: a policy naming a section (a Gateway listener, a Service port)
//!   applies there instead of one naming the whole object; the whole-object policy still applies
//!   to the other sections, and its status names the sections it is overridden on.
//! - **Conflicts**: of several policies naming exactly the same target and section, the oldest
//!   applies. Files carry no creation timestamps, so "oldest" is the smallest `namespace/name`
//!   (the rule translation already uses for routes); the others report `Conflicted`.
//! - A target that does not exist (or a kind Ballast cannot attach to yet) is reported as
//!   `TargetNotFound` on that policy; its other targets are unaffected.
//!
//! Resolution is a pure function of the policies and a target-existence check, independent of
//! input order, so status and translation agree on every replica. A policy kind plugs in by
//! listing its `(key, targetRefs)` and an existence check ([`resolve`]); lookups use
//! [`Resolution::effective`].

use std::collections::BTreeMap;

use serde::Serialize;

use crate::kinds::{ObjectKey, PolicyTargetRef, TargetKind};

/// An object a policy can attach to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TargetId {
    pub kind: TargetKind,
    pub key: ObjectKey,
}

/// One place a policy attaches to: a target and optionally one of its sections.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct AttachPoint {
    pub target: TargetId,
    pub section: Option<String>,
}

impl std::fmt::Display for AttachPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.target.kind, self.target.key)?;
        if let Some(s) = &self.section {
            write!(f, " section {s}")?;
        }
        Ok(())
    }
}

/// What became of one targetRef of a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// The policy applies here; `overridden` lists the sections where a more specific policy
    /// applies instead (section, policy).
    Accepted {
        overridden: Vec<(String, ObjectKey)>,
    },
    /// An older policy (`winner`) names the same target and section.
    Conflicted { winner: ObjectKey },
    /// The target does not exist or cannot be attached to; the message says which.
    TargetNotFound(String),
    /// The target exists but the policy's settings cannot work there (e.g. HTTP/3 on an
    /// HTTP listener); the policy is not applied there and the message says why.
    Invalid(String),
}

/// The outcome of one targetRef.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetStatus {
    /// Index into `spec.targetRefs`.
    pub index: usize,
    pub point: AttachPoint,
    pub outcome: Outcome,
}

/// Which policy applies at each attach point, and every policy's per-target outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    winners: BTreeMap<AttachPoint, ObjectKey>,
    /// Per policy (every policy given, in key order), its targetRefs' outcomes in order.
    pub statuses: BTreeMap<ObjectKey, Vec<TargetStatus>>,
}

/// The attach point of `r`, a targetRef of a policy in `namespace` (targetRefs are local).
pub fn attach_point(namespace: &str, r: &PolicyTargetRef) -> Option<AttachPoint> {
    Some(AttachPoint {
        target: TargetId {
            kind: r.target_kind()?,
            key: ObjectKey::new(namespace, r.name.as_str()),
        },
        section: r.section_name.as_ref().map(|s| s.value.clone()),
    })
}

/// Resolves `policies` (key and targetRefs; any order). `check` says whether an attach point
/// exists (`Err(message)` if not).
pub fn resolve<'a>(
    policies: impl IntoIterator<Item = (&'a ObjectKey, &'a [PolicyTargetRef])>,
    check: impl Fn(&AttachPoint) -> Result<(), String>,
) -> Resolution {
    resolve_with(policies, |_, p| check(p).map_err(Outcome::TargetNotFound))
}

/// [`resolve`] with a check that also sees the policy and answers the failing outcome
/// ([`Outcome::TargetNotFound`] or [`Outcome::Invalid`]) itself.
pub fn resolve_with<'a>(
    policies: impl IntoIterator<Item = (&'a ObjectKey, &'a [PolicyTargetRef])>,
    check: impl Fn(&ObjectKey, &AttachPoint) -> Result<(), Outcome>,
) -> Resolution {
    let mut policies: Vec<_> = policies.into_iter().collect();
    policies.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Resolution::default();
    for (key, refs) in policies {
        let mut statuses = Vec::with_capacity(refs.len());
        for (index, r) in refs.iter().enumerate() {
            let Some(point) = attach_point(&key.namespace, r) else {
                // Validation rejects unknown kinds; kept for completeness.
                continue;
            };
            let outcome = match check(key, &point) {
                Err(o) => o,
                Ok(()) => match out.winners.get(&point) {
                    Some(w) if w != key => Outcome::Conflicted { winner: w.clone() },
                    _ => {
                        out.winners.insert(point.clone(), key.clone());
                        Outcome::Accepted {
                            overridden: Vec::new(),
                        }
                    }
                },
            };
            statuses.push(TargetStatus {
                index,
                point,
                outcome,
            });
        }
        out.statuses.insert(key.clone(), statuses);
    }
    // Whole-target winners learn where section winners override them.
    let sections: Vec<(AttachPoint, ObjectKey)> = out
        .winners
        .iter()
        .filter(|(p, _)| p.section.is_some())
        .map(|(p, k)| (p.clone(), k.clone()))
        .collect();
    for (p, by) in sections {
        let whole = AttachPoint {
            target: p.target.clone(),
            section: None,
        };
        let Some(owner) = out.winners.get(&whole).cloned() else {
            continue;
        };
        if owner == by {
            continue;
        }
        for s in out.statuses.get_mut(&owner).into_iter().flatten() {
            if s.point == whole
                && let Outcome::Accepted { overridden } = &mut s.outcome
            {
                overridden.push((p.section.clone().unwrap_or_default(), by.clone()));
            }
        }
    }
    out
}

impl Resolution {
    /// The policy applying to `target`'s `section` (or to the whole target when `None`): the
    /// section's own winner, else the whole target's.
    pub fn effective(&self, target: &TargetId, section: Option<&str>) -> Option<&ObjectKey> {
        let mut point = AttachPoint {
            target: target.clone(),
            section: section.map(str::to_owned),
        };
        if let Some(k) = self.winners.get(&point) {
            return Some(k);
        }
        point.section = None;
        self.winners.get(&point)
    }

    /// Every attach point with the policy applying there.
    pub fn winners(&self) -> impl Iterator<Item = (&AttachPoint, &ObjectKey)> {
        self.winners.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spanned::Spanned;
    use proptest::prelude::*;

    fn tref(kind: &str, name: &str, section: Option<&str>) -> PolicyTargetRef {
        let group = TargetKind::from_ref("gateway.networking.k8s.io", kind)
            .or(TargetKind::from_ref("ballast.dev", kind))
            .or(TargetKind::from_ref("", kind))
            .map(|k| k.group())
            .unwrap_or("x");
        PolicyTargetRef {
            group: group.to_owned(),
            kind: Spanned::unpositioned(kind.to_owned()),
            name: Spanned::unpositioned(name.to_owned()),
            section_name: section.map(|s| Spanned::unpositioned(s.to_owned())),
        }
    }

    fn key(n: &str) -> ObjectKey {
        ObjectKey::new("default", n)
    }

    fn gw(name: &str) -> TargetId {
        TargetId {
            kind: TargetKind::Gateway,
            key: key(name),
        }
    }

    /// Gateway `edge` exists with listeners `http` and `https`; nothing else exists.
    fn check(p: &AttachPoint) -> Result<(), String> {
        match (
            p.target.kind,
            p.target.key.name.as_str(),
            p.section.as_deref(),
        ) {
            (TargetKind::Gateway, "edge", None | Some("http" | "https")) => Ok(()),
            _ => Err(format!("{p} not found")),
        }
    }

    /// The table of GEP-713 cases: (policies in any order, expected effective policy for the
    /// listeners http and https, expected outcomes per policy).
    #[test]
    fn precedence_and_conflict_table() {
        type Case = (
            Vec<(&'static str, Vec<PolicyTargetRef>)>,
            [Option<&'static str>; 2],
            Vec<(&'static str, Vec<&'static str>)>,
        );
        let cases: Vec<Case> = vec![
            // One gateway-wide policy applies to every listener.
            (
                vec![("a", vec![tref("Gateway", "edge", None)])],
                [Some("a"), Some("a")],
                vec![("a", vec!["accepted"])],
            ),
            // A listener policy beats the gateway policy on its listener only.
            (
                vec![
                    ("z-gw", vec![tref("Gateway", "edge", None)]),
                    ("a-listener", vec![tref("Gateway", "edge", Some("https"))]),
                ],
                [Some("z-gw"), Some("a-listener")],
                vec![
                    ("a-listener", vec!["accepted"]),
                    ("z-gw", vec!["accepted overridden:https=a-listener"]),
                ],
            ),
            // Two policies on the same point: the oldest (smallest name) wins.
            (
                vec![
                    ("b", vec![tref("Gateway", "edge", None)]),
                    ("a", vec![tref("Gateway", "edge", None)]),
                ],
                [Some("a"), Some("a")],
                vec![("a", vec!["accepted"]), ("b", vec!["conflicted:a"])],
            ),
            // Missing targets and sections are reported; other refs still apply.
            (
                vec![(
                    "a",
                    vec![
                        tref("Gateway", "nope", None),
                        tref("Gateway", "edge", Some("grpc")),
                        tref("Gateway", "edge", Some("http")),
                    ],
                )],
                [Some("a"), None],
                vec![("a", vec!["not-found", "not-found", "accepted"])],
            ),
            // Conflicts are per point: one policy can win one listener and lose another.
            (
                vec![
                    ("a", vec![tref("Gateway", "edge", Some("http"))]),
                    (
                        "b",
                        vec![
                            tref("Gateway", "edge", Some("http")),
                            tref("Gateway", "edge", Some("https")),
                        ],
                    ),
                ],
                [Some("a"), Some("b")],
                vec![
                    ("a", vec!["accepted"]),
                    ("b", vec!["conflicted:a", "accepted"]),
                ],
            ),
        ];
        for (i, (policies, want, outcomes)) in cases.into_iter().enumerate() {
            let keys: Vec<ObjectKey> = policies.iter().map(|(n, _)| key(n)).collect();
            let res = resolve(
                keys.iter().zip(policies.iter().map(|(_, r)| r.as_slice())),
                check,
            );
            let got = [
                res.effective(&gw("edge"), Some("http"))
                    .map(|k| k.name.as_str()),
                res.effective(&gw("edge"), Some("https"))
                    .map(|k| k.name.as_str()),
            ];
            assert_eq!(got, want, "case {i}");
            for (p, expected) in outcomes {
                let got: Vec<String> = res.statuses[&key(p)]
                    .iter()
                    .map(|s| match &s.outcome {
                        Outcome::Accepted { overridden } if overridden.is_empty() => {
                            "accepted".to_owned()
                        }
                        Outcome::Accepted { overridden } => format!(
                            "accepted overridden:{}",
                            overridden
                                .iter()
                                .map(|(s, k)| format!("{s}={}", k.name))
                                .collect::<Vec<_>>()
                                .join(",")
                        ),
                        Outcome::Conflicted { winner } => format!("conflicted:{}", winner.name),
                        Outcome::TargetNotFound(_) => "not-found".to_owned(),
                        Outcome::Invalid(_) => "invalid".to_owned(),
                    })
                    .collect();
                assert_eq!(got, expected, "case {i} policy {p}");
            }
        }
    }

    fn arb_ref() -> impl Strategy<Value = (u8, Option<u8>)> {
        (0u8..3, prop::option::of(0u8..3))
    }

    proptest! {
        /// Against a brute-force reading of the rules: the effective policy of a section is the
        /// smallest-keyed policy naming that exact section of an existing target, else the
        /// smallest naming the whole target; resolution ignores input order; a policy is
        /// `Accepted` at a point exactly when it is that point's winner.
        #[test]
        fn matches_brute_force(
            policies in prop::collection::btree_map(0u8..6, prop::collection::vec(arb_ref(), 0..4), 0..6),
            reverse in any::<bool>(),
        ) {
            let names = ["edge", "other", "missing"];
            let sections = ["http", "https", "nope"];
            let exists = |p: &AttachPoint| -> Result<(), String> {
                let t_ok = p.target.key.name != "missing";
                let s_ok = p.section.as_deref().is_none_or(|s| s != "nope");
                if t_ok && s_ok { Ok(()) } else { Err("missing".into()) }
            };
            let list: Vec<(ObjectKey, Vec<PolicyTargetRef>)> = policies
                .iter()
                .map(|(k, refs)| {
                    let mut refs: Vec<PolicyTargetRef> = refs
                        .iter()
                        .map(|(t, s)| tref("Gateway", names[*t as usize], s.map(|s| sections[s as usize])))
                        .collect();
                    refs.dedup();
                    (key(&format!("p{k}")), refs)
                })
                .collect();
            let mut input: Vec<(&ObjectKey, &[PolicyTargetRef])> =
                list.iter().map(|(k, r)| (k, r.as_slice())).collect();
            if reverse {
                input.reverse();
            }
            let res = resolve(input, exists);
            for t in names {
                for s in [None, Some("http"), Some("https"), Some("nope")] {
                    let names_point = |sec: Option<&str>| {
                        list.iter().find(|(_, refs)| {
                            refs.iter().any(|r| {
                                *r.name == t && r.section_name.as_deref().map(|x| x.as_str()) == sec
                            })
                        })
                        .map(|(k, _)| k)
                        .filter(|_| {
                            exists(&AttachPoint { target: gw(t), section: sec.map(str::to_owned) }).is_ok()
                        })
                    };
                    let want = s.and_then(|s| names_point(Some(s))).or_else(|| names_point(None));
                    prop_assert_eq!(res.effective(&gw(t), s), want, "{} {:?}", t, s);
                }
            }
            for (k, statuses) in &res.statuses {
                for st in statuses {
                    let accepted = matches!(st.outcome, Outcome::Accepted { .. });
                    let winner = res.winners.get(&st.point) == Some(k);
                    prop_assert_eq!(accepted, winner, "{} at {}", k, st.point);
                }
            }
        }
    }
}
