//! `Digest`: the blake3 content address of a blob.

use std::fmt;
use std::str::FromStr;

/// A blake3 digest, shown and sent as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps a finished hasher.
    pub fn from_hasher(hasher: &blake3::Hasher) -> Self {
        Self(*hasher.finalize().as_bytes())
    }

    /// Lowercase hex form.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.to_hex()[..12])
    }
}

/// A string that is not 64 hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a blake3 digest (64 hex characters)")]
pub struct BadDigest(pub String);

impl FromStr for Digest {
    type Err = BadDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDigest(s.chars().take(80).collect());
        // Hex digits only: `from_str_radix` alone would take `+f` as 15, so
        // two spellings would name one blob.
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(out))
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let d = Digest::of(b"tessera");
        assert_eq!(d.to_hex().len(), 64);
        assert_eq!(d.to_hex().parse::<Digest>().unwrap(), d);
        assert!("zz".parse::<Digest>().is_err());
        assert!("g".repeat(64).parse::<Digest>().is_err());
        assert!("é".repeat(32).parse::<Digest>().is_err());
    }

    #[test]
    fn a_sign_is_not_a_hex_digit() {
        // Found by the `requests` fuzz target: `+1` parsed as the byte 0x01.
        let s = "af1349b9f5f9+1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";
        assert!(s.parse::<Digest>().is_err());
        assert!("+f".repeat(32).parse::<Digest>().is_err());
        let upper = "AF1349B9F5F901A6A0404DEA36DCC9499BCB25C9ADC112B7CC9A93CAE41F3262";
        assert_eq!(
            upper.parse::<Digest>().unwrap().to_hex(),
            upper.to_lowercase()
        );
    }
}
