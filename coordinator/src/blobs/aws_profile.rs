//! S3 settings from the AWS shared config files, the way the AWS CLI reads
//! them: `~/.aws/credentials` (or `$AWS_SHARED_CREDENTIALS_FILE`) and
//! `~/.aws/config` (or `$AWS_CONFIG_FILE`), profile `$AWS_PROFILE` or
//! `default`. Only what an S3 blob store needs is read: the key pair, a
//! session token, the region and `endpoint_url`. Environment variables win
//! over the files (the caller applies these only where the environment is silent).

use std::path::PathBuf;

use object_store::aws::AmazonS3ConfigKey;

/// The settings the files give for the current profile (empty when there are none).
pub fn settings() -> Vec<(AmazonS3ConfigKey, String)> {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, name: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let mut out = Vec::new();
    // In `credentials` a section is the bare profile name; in `config` it is
    // `profile NAME`, except `default`.
    if let Some(text) = file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        out.extend(section(&text, &profile));
    }
    if let Some(text) =
        file("AWS_CONFIG_FILE", "config").and_then(|p| std::fs::read_to_string(p).ok())
    {
        let name = if profile == "default" {
            profile.clone()
        } else {
            format!("profile {profile}")
        };
        for (k, v) in section(&text, &name) {
            if !out.iter().any(|(have, _)| *have == k) {
                out.push((k, v));
            }
        }
    }
    out
}

/// The known keys of section `[name]` of an INI text.
fn section(text: &str, name: &str) -> Vec<(AmazonS3ConfigKey, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == name;
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = match key.trim() {
            "aws_access_key_id" => AmazonS3ConfigKey::AccessKeyId,
            "aws_secret_access_key" => AmazonS3ConfigKey::SecretAccessKey,
            "aws_session_token" => AmazonS3ConfigKey::Token,
            "region" => AmazonS3ConfigKey::Region,
            "endpoint_url" => AmazonS3ConfigKey::Endpoint,
            _ => continue,
        };
        let value = value.trim();
        if inside && !value.is_empty() {
            out.push((key, value.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_section_gives_its_keys_only() {
        let text = "[default]\naws_access_key_id = AK1\n\n[profile farm]\n# comment\naws_access_key_id=AK2\naws_secret_access_key = SK2\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:9000\noutput = json\n";
        let farm = section(text, "profile farm");
        assert_eq!(
            farm,
            vec![
                (AmazonS3ConfigKey::AccessKeyId, "AK2".into()),
                (AmazonS3ConfigKey::SecretAccessKey, "SK2".into()),
                (AmazonS3ConfigKey::Region, "eu-west-1".into()),
                (AmazonS3ConfigKey::Endpoint, "http://127.0.0.1:9000".into()),
            ]
        );
        assert_eq!(
            section(text, "default"),
            vec![(AmazonS3ConfigKey::AccessKeyId, "AK1".into())]
        );
        assert!(section(text, "other").is_empty());
    }
}
