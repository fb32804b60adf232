//! Users inside a sandbox: resolved from the sandbox's own `/etc/passwd` and `/etc/group`,
//! never the host's, and the E2B default user created on request.

use std::fs;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// The account databases of one root filesystem.
#[derive(Debug, Clone, Default)]
pub struct UserDb {
    pub passwd: Vec<PasswdEntry>,
    pub groups: Vec<GroupEntry>,
}

/// Who a command runs as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, the primary group included.
    pub groups: Vec<u32>,
    pub home: String,
}

impl UserDb {
    pub fn parse(passwd: &str, group: &str) -> UserDb {
        let passwd = passwd
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 7).then(|| {
                    Some(PasswdEntry {
                        name: f[0].to_string(),
                        uid: f[2].parse().ok()?,
                        gid: f[3].parse().ok()?,
                        home: f[5].to_string(),
                        shell: f[6].to_string(),
                    })
                })?
            })
            .collect();
        let groups = group
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 4).then(|| {
                    Some(GroupEntry {
                        name: f[0].to_string(),
                        gid: f[2].parse().ok()?,
                        members: f[3]
                            .split(',')
                            .filter(|m| !m.is_empty())
                            .map(str::to_string)
                            .collect(),
                    })
                })?
            })
            .collect();
        UserDb { passwd, groups }
    }

    /// Reads `<root>/etc/passwd` and `<root>/etc/group`; missing files are empty.
    pub fn load(root: &Path) -> UserDb {
        let read = |p: &str| fs::read_to_string(root.join(p)).unwrap_or_default();
        UserDb::parse(&read("etc/passwd"), &read("etc/group"))
    }

    pub fn user_by_name(&self, name: &str) -> Option<&PasswdEntry> {
        self.passwd.iter().find(|p| p.name == name)
    }

    fn group_gid(&self, spec: &str) -> Result<u32, String> {
        if let Ok(gid) = spec.parse() {
            return Ok(gid);
        }
        self.groups
            .iter()
            .find(|g| g.name == spec)
            .map(|g| g.gid)
            .ok_or_else(|| format!("group {spec:?} is not in the sandbox's /etc/group"))
    }

    /// Resolves `name`, `uid`, `name:group` or `uid:gid`.
    pub fn resolve(&self, spec: &str) -> Result<ResolvedUser, String> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let entry = match user.parse::<u32>() {
            Ok(uid) => self
                .passwd
                .iter()
                .find(|p| p.uid == uid)
                .cloned()
                .or(Some(PasswdEntry {
                    name: uid.to_string(),
                    uid,
                    // Docker's rule: a uid without an account runs with the root group.
                    gid: 0,
                    home: "/".into(),
                    shell: "/bin/sh".into(),
                })),
            Err(_) => self.user_by_name(user).cloned(),
        };
        let entry = match entry {
            Some(e) => e,
            None if user == "root" => PasswdEntry {
                name: "root".into(),
                uid: 0,
                gid: 0,
                home: "/root".into(),
                shell: "/bin/sh".into(),
            },
            None => return Err(format!("user {user:?} is not in the sandbox's /etc/passwd")),
        };
        let gid = match group {
            Some(g) => self.group_gid(g)?,
            None => entry.gid,
        };
        let mut groups = vec![gid];
        if group.is_none() {
            for g in &self.groups {
                if g.members.iter().any(|m| m == &entry.name) && !groups.contains(&g.gid) {
                    groups.push(g.gid);
                }
            }
        }
        Ok(ResolvedUser {
            name: entry.name,
            uid: entry.uid,
            gid,
            groups,
            home: entry.home,
        })
    }

    /// COPY's owner rule: `user` alone means `user:user` (falling back to the user's primary
    /// group when no group has that name).
    pub fn resolve_owner(&self, spec: &str) -> Result<(u32, u32), String> {
        if spec.contains(':') {
            let u = self.resolve(spec)?;
            return Ok((u.uid, u.gid));
        }
        let u = self.resolve(spec)?;
        let gid = self.group_gid(spec).unwrap_or(u.gid);
        Ok((u.uid, gid))
    }
}

/// Creates `name` if missing (E2B's implicit `USER user true`): `useradd --create-home` when
/// the image has it, else by editing passwd, group and shadow (busybox images). With `sudo`,
/// and when the image has sudo, grants passwordless sudo. Runs inside the sandbox.
///
/// Docker's other forms, a numeric uid or `user:group`, name an identity rather than an
/// account to make: they are only resolved (a uid needs no account, a group must exist), as
/// `docker build` does, so `USER 1000:1000` from a Dockerfile means what it means there.
pub fn ensure_user(root: &Path, name: &str, sudo: bool) -> Result<(), String> {
    if name.contains(':') || (!name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())) {
        return UserDb::load(root).resolve(name).map(drop);
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    {
        return Err(format!("{name:?} is not a valid user name"));
    }
    let db = UserDb::load(root);
    let shell = if root.join("bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    if db.user_by_name(name).is_none() {
        let useradd = ["usr/sbin/useradd", "sbin/useradd"]
            .iter()
            .map(|p| root.join(p))
            .find(|p| p.exists());
        if let Some(useradd) = useradd {
            let status = std::process::Command::new(useradd)
                .args(["--create-home", "--shell", shell, name])
                .status()
                .map_err(|e| format!("running useradd: {e}"))?;
            if !status.success() {
                return Err(format!("useradd {name} failed with {status}"));
            }
        } else {
            add_user_by_editing(root, &db, name, shell)?;
        }
    }
    if sudo
        && ["usr/bin/sudo", "bin/sudo"]
            .iter()
            .any(|p| root.join(p).exists())
    {
        let dir = root.join("etc/sudoers.d");
        fs::create_dir_all(&dir).map_err(|e| format!("creating /etc/sudoers.d: {e}"))?;
        let file = dir.join(name);
        fs::write(&file, format!("{name} ALL=(ALL:ALL) NOPASSWD: ALL\n"))
            .map_err(|e| format!("writing sudoers: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&file, fs::Permissions::from_mode(0o440))
            .map_err(|e| format!("chmod sudoers: {e}"))?;
    }
    Ok(())
}

fn add_user_by_editing(root: &Path, db: &UserDb, name: &str, shell: &str) -> Result<(), String> {
    let used_uid = |id: u32| db.passwd.iter().any(|p| p.uid == id);
    let used_gid = |id: u32| db.groups.iter().any(|g| g.gid == id);
    let id = (1000..60000)
        .find(|id| !used_uid(*id) && !used_gid(*id))
        .ok_or("no free uid between 1000 and 60000")?;
    let home = format!("/home/{name}");
    let append = |path: &str, line: String| -> Result<(), String> {
        use std::io::Write;
        let p = root.join(path);
        let mut existing = fs::read(&p).unwrap_or_default();
        if !existing.is_empty() && !existing.ends_with(b"\n") {
            existing.push(b'\n');
        }
        let mut f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&p)
            .map_err(|e| format!("opening /{path}: {e}"))?;
        f.write_all(&existing)
            .and_then(|_| f.write_all(line.as_bytes()))
            .map_err(|e| format!("writing /{path}: {e}"))
    };
    append(
        "etc/passwd",
        format!("{name}:x:{id}:{id}::{home}:{shell}\n"),
    )?;
    append("etc/group", format!("{name}:x:{id}:\n"))?;
    if root.join("etc/shadow").exists() {
        append("etc/shadow", format!("{name}:!:19000:0:99999:7:::\n"))?;
    }
    let home_path = root.join(home.trim_start_matches('/'));
    fs::create_dir_all(&home_path).map_err(|e| format!("creating {home}: {e}"))?;
    std::os::unix::fs::chown(&home_path, Some(id), Some(id))
        .map_err(|e| format!("chown {home}: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:user\nuser:x:1000:\nstaff:x:50:\n";

    #[test]
    fn names_uids_and_groups_resolve_from_the_given_files() {
        let db = UserDb::parse(PASSWD, GROUP);
        let u = db.resolve("user").unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (1000, 1000, "/home/user"));
        assert_eq!(u.groups, vec![1000, 27]);
        let u = db.resolve("1000:50").unwrap();
        assert_eq!(
            (u.name.as_str(), u.gid, u.groups.clone()),
            ("user", 50, vec![50])
        );
        let u = db.resolve("4242").unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (4242, 0, "/"));
        assert!(db
            .resolve("nobody-here")
            .unwrap_err()
            .contains("/etc/passwd"));
        assert!(db.resolve("user:nogroup").is_err());
        assert_eq!(db.resolve_owner("user").unwrap(), (1000, 1000));
        assert_eq!(db.resolve_owner("user:staff").unwrap(), (1000, 50));
        assert_eq!(UserDb::default().resolve("root").unwrap().uid, 0);
    }

    #[test]
    fn a_user_is_added_by_editing_files_when_useradd_is_absent() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("etc")).unwrap();
        fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh",
        )
        .unwrap();
        fs::write(root.path().join("etc/group"), "root:x:0:\n").unwrap();
        fs::write(
            root.path().join("etc/shadow"),
            "root:*:19000:0:99999:7:::\n",
        )
        .unwrap();
        ensure_user(root.path(), "user", true).unwrap();
        ensure_user(root.path(), "user", true).unwrap();
        let db = UserDb::load(root.path());
        let u = db.resolve("user").unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (1000, 1000, "/home/user"));
        assert_eq!(db.passwd.len(), 2, "idempotent");
        assert!(root.path().join("home/user").is_dir());
        assert!(fs::read_to_string(root.path().join("etc/shadow"))
            .unwrap()
            .contains("user:!"));
        assert!(ensure_user(root.path(), "bad name", false).is_err());
    }

    #[test]
    fn a_uid_or_user_group_spec_is_resolved_and_never_creates_an_account() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("etc")).unwrap();
        fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n",
        )
        .unwrap();
        fs::write(root.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        ensure_user(root.path(), "1000:1000", false).unwrap();
        ensure_user(root.path(), "1234", false).unwrap();
        ensure_user(root.path(), "root:staff", false).unwrap();
        assert_eq!(
            UserDb::load(root.path()).passwd.len(),
            1,
            "no account was added"
        );
        assert!(!root.path().join("home").exists());
        let err = ensure_user(root.path(), "1000:nogroup", false).unwrap_err();
        assert!(err.contains("nogroup"), "{err}");
        let err = ensure_user(root.path(), "ghost:staff", false).unwrap_err();
        assert!(err.contains("ghost"), "{err}");
    }
}
