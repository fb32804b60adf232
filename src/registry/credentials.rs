//! From the credentials a build start brings (`fromImageRegistry`) to what a registry accepts.
//!
//! * `registry`: the username and password, as they are.
//! * `gcp`: the service-account JSON key as the password of user `_json_key`, the basic-auth
//!   form Google's registries (gcr.io, *-docker.pkg.dev) accept for a JSON key; no exchange.
//! * `aws`: ECR's `GetAuthorizationToken` (signed with AWS Signature Version 4) at
//!   `https://api.ecr.<region>.amazonaws.com/`; its token decodes to `AWS:<password>`. The
//!   signing is tested against AWS's published example; the call itself cannot be made offline
//!   and is untested against ECR.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};

use super::error::PullError;
use super::session::BasicAuth;
use crate::domain::build_spec::RegistryCredentials;

/// The basic-auth pair for `credentials`, exchanging AWS keys for an ECR token first.
pub async fn basic_auth(
    http: &reqwest::Client,
    image: &str,
    credentials: &RegistryCredentials,
) -> Result<BasicAuth, PullError> {
    match credentials {
        RegistryCredentials::Registry { username, password } => Ok(BasicAuth {
            username: username.clone(),
            password: password.clone(),
        }),
        RegistryCredentials::Gcp {
            service_account_json,
        } => Ok(BasicAuth {
            username: "_json_key".into(),
            password: service_account_json.clone(),
        }),
        RegistryCredentials::Aws {
            access_key_id,
            secret_access_key,
            region,
        } => {
            ecr_token(
                http,
                image,
                access_key_id,
                secret_access_key,
                region,
                Utc::now(),
            )
            .await
        }
    }
}

async fn ecr_token(
    http: &reqwest::Client,
    image: &str,
    access_key_id: &str,
    secret_access_key: &str,
    region: &str,
    now: DateTime<Utc>,
) -> Result<BasicAuth, PullError> {
    let fail = |detail: String| PullError::TokenExchange {
        image: image.to_owned(),
        provider: "AWS",
        detail,
    };
    if region.is_empty()
        || !region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(fail(format!("region {region:?} is not an AWS region name")));
    }
    let host = format!("api.ecr.{region}.amazonaws.com");
    let body = b"{}";
    let target = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken";
    let content_type = "application/x-amz-json-1.1";
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let headers = [
        ("content-type", content_type.to_owned()),
        ("host", host.clone()),
        ("x-amz-date", amz_date.clone()),
        ("x-amz-target", target.to_owned()),
    ];
    let authorization = sigv4_authorization(
        "POST",
        "/",
        "",
        &headers,
        body,
        access_key_id,
        secret_access_key,
        region,
        "ecr",
        now,
    );
    let response = http
        .post(format!("https://{host}/"))
        .header("content-type", content_type)
        .header("x-amz-date", &amz_date)
        .header("x-amz-target", target)
        .header("authorization", authorization)
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| fail(format!("reaching {host}: {e}")))?;
    let status = response.status();
    // An authorization answer is a few KiB; anything longer is not one.
    let bytes = super::session::read_limited(response, 1 << 20)
        .await
        .map_err(|e| fail(format!("reading ECR's answer: {e}")))?;
    if !status.is_success() {
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let message = v["message"]
            .as_str()
            .or(v["Message"].as_str())
            .unwrap_or("no details");
        return Err(fail(format!(
            "ECR answered {status}: {}",
            message.chars().take(200).collect::<String>()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| fail(format!("ECR's answer is not JSON: {e}")))?;
    let token = v["authorizationData"][0]["authorizationToken"]
        .as_str()
        .ok_or_else(|| fail("ECR's answer holds no authorization token".into()))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| fail("ECR's token is not base64 text".into()))?;
    let (username, password) = decoded
        .split_once(':')
        .ok_or_else(|| fail("ECR's token is not `user:password`".into()))?;
    Ok(BasicAuth {
        username: username.to_owned(),
        password: password.to_owned(),
    })
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The `Authorization` header of an AWS Signature Version 4 request. `headers` are the signed
/// headers, lower-case names, sorted by name.
#[allow(clippy::too_many_arguments)]
pub fn sigv4_authorization(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, String)],
    body: &[u8],
    access_key_id: &str,
    secret_access_key: &str,
    region: &str,
    service: &str,
    now: DateTime<Utc>,
) -> String {
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let date = now.format("%Y%m%d").to_string();
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| *k)
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(body))
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let k_date = hmac(
        format!("AWS4{secret_access_key}").as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex::encode(hmac(&k_signing, string_to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={signed_headers}, Signature={signature}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    /// AWS's published Signature Version 4 example (IAM ListUsers, 2015-08-30).
    #[test]
    fn sigv4_matches_the_published_example() {
        let now = Utc.with_ymd_and_hms(2015, 8, 30, 12, 36, 0).unwrap();
        let header = sigv4_authorization(
            "GET",
            "/",
            "Action=ListUsers&Version=2010-05-08",
            &[
                (
                    "content-type",
                    "application/x-www-form-urlencoded; charset=utf-8".into(),
                ),
                ("host", "iam.amazonaws.com".into()),
                ("x-amz-date", "20150830T123600Z".into()),
            ],
            b"",
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "us-east-1",
            "iam",
            now,
        );
        assert_eq!(
            header,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }
}
