//! Users and their tokens: who holds a token, adding and removing users.

use super::*;

impl Farm {
    /// Who holds `token`, or why not.
    pub fn authenticate(&self, token: Option<&str>) -> Result<Identity, Error> {
        if !self.config.auth {
            return Ok(Identity::local());
        }
        let token = token.ok_or(Error::Unauthenticated(
            "no token given; pass --token, set $TESSERA_TOKEN, or put it in ~/.config/tessera/token",
        ))?;
        let hash = auth::token_hash(token);
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
            .cloned()
            .ok_or(Error::Unauthenticated(
                "the token is not valid; ask the farm's admin for one",
            ))
    }

    /// Creates the admin on first start; returns its token to hand over.
    pub fn ensure_admin(&self) -> Result<Option<String>, Error> {
        if !self.config.auth || self.lock().users.values().any(|u| u.role == Role::Admin) {
            return Ok(None);
        }
        let token = self.add_user_record("admin", Role::Admin)?;
        Ok(Some(token))
    }

    fn add_user_record(&self, name: &str, role: Role) -> Result<String, Error> {
        auth::check_name(name)?;
        let token = auth::new_token()?;
        let record = UserRecord {
            name: name.to_string(),
            role,
            token_hash: auth::token_hash(&token),
            created_ms: self.clock.now_ms(),
        };
        let mut st = self.lock();
        if st.users.contains_key(name) {
            return Err(Error::Conflict(format!(
                "user {name} exists; remove it first to issue a new token"
            )));
        }
        let ticket = self.commit(&st, vec![Owned::User(record.clone())]);
        st.users.insert(name.to_string(), record.clone());
        drop(st);
        ticket.wait()?;
        self.remember_token(&record);
        tracing::info!(user = name, role = role.name(), "user added");
        Ok(token)
    }

    /// Adds a user and returns its token (admins only).
    pub fn add_user(&self, who: &Identity, name: &str, role: Role) -> Result<String, Error> {
        Self::admin_only(who)?;
        self.add_user_record(name, role)
    }

    /// Removes a user: its token stops working at once (admins only).
    pub fn remove_user(&self, who: &Identity, name: &str) -> Result<(), Error> {
        Self::admin_only(who)?;
        let mut st = self.lock();
        let user = st
            .users
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("user {name}")))?;
        if user.role == Role::Admin
            && st.users.values().filter(|u| u.role == Role::Admin).count() == 1
        {
            return Err(Error::Conflict(
                "that is the last admin; add another admin first".into(),
            ));
        }
        let ticket = self.commit(&st, vec![Owned::RemoveUser(name.to_string())]);
        st.users.remove(name);
        drop(st);
        // The token stops working now, even before the removal is stored.
        self.tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, who| who.name != name);
        ticket.wait()?;
        tracing::info!(user = name, "user removed");
        Ok(())
    }

    /// Every user (admins only).
    pub fn users(&self, who: &Identity) -> Result<Vec<UserRecord>, Error> {
        Self::admin_only(who)?;
        Ok(self.lock().users.values().cloned().collect())
    }

    /// Makes `record`'s token authenticate.
    pub(super) fn remember_token(&self, record: &UserRecord) {
        self.tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                record.token_hash.clone(),
                Identity {
                    name: record.name.clone(),
                    role: record.role,
                },
            );
    }

    pub(super) fn admin_only(who: &Identity) -> Result<(), Error> {
        if who.is_admin() {
            Ok(())
        } else {
            Err(Error::PermissionDenied(
                "only an admin manages users".into(),
            ))
        }
    }
}
