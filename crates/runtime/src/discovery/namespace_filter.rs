//! Which namespaces a discovery watcher keeps, and the key prefixes that cover them.

use crate::names;

/// Which namespaces a watcher keeps (`--namespace` / `--namespace-prefix`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NamespaceFilter {
    /// Every namespace (neither flag given).
    #[default]
    All,
    /// Exactly this namespace.
    Exact(String),
    /// Namespaces starting with this text (`ns` keeps `ns` and `ns-abc123`).
    Prefix(String),
}

impl NamespaceFilter {
    /// The filter the frontend flags select: the prefix wins over the exact namespace.
    pub fn from_flags(namespace: Option<&str>, namespace_prefix: Option<&str>) -> Self {
        match (namespace_prefix, namespace) {
            (Some(prefix), _) => Self::Prefix(prefix.to_owned()),
            (None, Some(namespace)) => Self::Exact(namespace.to_owned()),
            (None, None) => Self::All,
        }
    }

    /// Whether records of `namespace` pass the filter.
    pub fn matches(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Exact(exact) => namespace == exact,
            Self::Prefix(prefix) => namespace.starts_with(prefix.as_str()),
        }
    }

    /// The narrowest key prefix covering every record kind of the filter's namespaces.
    pub(super) fn root_prefix(&self) -> String {
        match self {
            Self::All => names::KEY_ROOT.to_owned(),
            Self::Exact(namespace) => names::namespace_prefix(namespace),
            Self::Prefix(prefix) => format!("{}{prefix}", names::KEY_ROOT),
        }
    }

    /// The narrowest key prefix covering the filter; `kind` is `instances` or `models`.
    pub(super) fn key_prefix(&self, kind: &str) -> String {
        match self {
            Self::All => names::KEY_ROOT.to_owned(),
            Self::Exact(namespace) => format!("{}{kind}/", names::namespace_prefix(namespace)),
            Self::Prefix(prefix) => format!("{}{prefix}", names::KEY_ROOT),
        }
    }
}
