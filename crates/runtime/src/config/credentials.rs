//! Secrets of the NATS and etcd clients, read from the environment only, under Dynamo's names: a
//! command line is visible to every user of the host (`ps`) and `--dump-config-to` writes every
//! option it knows, so a password never travels as a flag. Certificates and the NATS credentials
//! file are paths, which are options ([`super::TlsOpts`]).

/// NATS user name (with [`NATS_AUTH_PASSWORD`]).
pub const NATS_AUTH_USERNAME: &str = "NATS_AUTH_USERNAME";
/// NATS password (with [`NATS_AUTH_USERNAME`]).
pub const NATS_AUTH_PASSWORD: &str = "NATS_AUTH_PASSWORD";
/// NATS authentication token.
pub const NATS_AUTH_TOKEN: &str = "NATS_AUTH_TOKEN";
/// NATS NKey seed (`SU...`).
pub const NATS_AUTH_NKEY: &str = "NATS_AUTH_NKEY";
/// etcd user name (with [`ETCD_AUTH_PASSWORD`]).
pub const ETCD_AUTH_USERNAME: &str = "ETCD_AUTH_USERNAME";
/// etcd password (with [`ETCD_AUTH_USERNAME`]).
pub const ETCD_AUTH_PASSWORD: &str = "ETCD_AUTH_PASSWORD";

/// How the NATS client proves who it is, besides a client certificate and a credentials file.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// Nothing (or user and password in the `NATS_SERVER` URL).
    #[default]
    None,
    /// User name and password.
    UserPassword(String, String),
    /// A token.
    Token(String),
    /// An NKey seed.
    NKey(String),
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword(user, _) => write!(f, "UserPassword({user:?}, <redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::NKey(_) => f.write_str("NKey(<redacted>)"),
        }
    }
}

/// The secrets of the environment (see the module docs).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// NATS authentication.
    pub nats: NatsAuth,
    /// etcd user name and password.
    pub etcd_user: Option<(String, String)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("nats", &self.nats)
            .field(
                "etcd_user",
                &self
                    .etcd_user
                    .as_ref()
                    .map(|(user, _)| (user, "<redacted>")),
            )
            .finish()
    }
}

impl Credentials {
    /// Reads the process's environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
    }

    /// Reads the variables through `lookup` (empty values count as unset); a user without a
    /// password (or the reverse), or more than one NATS method, is an error naming them.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let pair = |user: &str, password: &str| match (lookup(user), lookup(password)) {
            (Some(u), Some(p)) => Ok(Some((u, p))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(format!("{user}: needs {password}")),
            (None, Some(_)) => Err(format!("{password}: needs {user}")),
        };
        let mut methods = Vec::new();
        if let Some((user, password)) = pair(NATS_AUTH_USERNAME, NATS_AUTH_PASSWORD)? {
            methods.push((NATS_AUTH_USERNAME, NatsAuth::UserPassword(user, password)));
        }
        if let Some(token) = lookup(NATS_AUTH_TOKEN) {
            methods.push((NATS_AUTH_TOKEN, NatsAuth::Token(token)));
        }
        if let Some(seed) = lookup(NATS_AUTH_NKEY) {
            methods.push((NATS_AUTH_NKEY, NatsAuth::NKey(seed)));
        }
        if methods.len() > 1 {
            let names: Vec<&str> = methods.iter().map(|(name, _)| *name).collect();
            return Err(format!(
                "{}: more than one NATS authentication method; set one",
                names.join(", ")
            ));
        }
        Ok(Self {
            nats: methods.pop().map(|(_, auth)| auth).unwrap_or_default(),
            etcd_user: pair(ETCD_AUTH_USERNAME, ETCD_AUTH_PASSWORD)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Credentials, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Credentials::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn methods_pairs_and_conflicts() {
        assert_eq!(read(&[]).unwrap(), Credentials::default());
        let both = read(&[
            (NATS_AUTH_USERNAME, "u"),
            (NATS_AUTH_PASSWORD, "p"),
            (ETCD_AUTH_USERNAME, "root"),
            (ETCD_AUTH_PASSWORD, "secret"),
        ])
        .unwrap();
        assert_eq!(both.nats, NatsAuth::UserPassword("u".into(), "p".into()));
        assert_eq!(both.etcd_user, Some(("root".into(), "secret".into())));
        let shown = format!("{both:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("\"p\""),
            "{shown}"
        );
        assert_eq!(
            read(&[(NATS_AUTH_TOKEN, "t")]).unwrap().nats,
            NatsAuth::Token("t".into())
        );
        let error = read(&[(ETCD_AUTH_USERNAME, "root")]).unwrap_err();
        assert!(error.contains(ETCD_AUTH_PASSWORD), "{error}");
        let error = read(&[(NATS_AUTH_TOKEN, "t"), (NATS_AUTH_NKEY, "SU")]).unwrap_err();
        assert!(
            error.contains(NATS_AUTH_TOKEN) && error.contains(NATS_AUTH_NKEY),
            "{error}"
        );
    }
}
