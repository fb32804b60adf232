"""A build step is an unprivileged guest (ADR 0021), tried as a hostile tenant would: root steps
(and `sudo` from the default user) through the stock Python SDK, each probe printing one
`PROBE name result` line into the build log. Every probe is harmless to the host when the
boundary is missing: a sysctl is written back with the value it already has, and
`/proc/sysrq-trigger` is only opened for writing, never written to.
"""

import re
import uuid

from e2b import Template

from test_sdk_build import exec_in

# Docker's default capability set without CAP_NET_RAW, as /proc/<pid>/status prints it.
SANDBOX_CAPS = "00000000a80405fb"
NO_CAPS = "0000000000000000"
# The default STRATA_SANDBOX_ID_RANGE.
ID_BASE = 1_000_000_000

# Each probe: a shell snippet whose last line prints its verdict.
PROBES = r"""
probe() { printf 'PROBE %s %s\n' "$1" "$2"; }
if (cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern) 2>/dev/null; then probe core_pattern written; else probe core_pattern refused; fi
if (exec 3>/proc/sysrq-trigger) 2>/dev/null; then probe sysrq opened; else probe sysrq refused; fi
if unshare -U -r true 2>/dev/null; then probe userns created; else probe userns "refused:$(unshare -U -r true 2>&1 | tr ' ' _)"; fi
if mount -t tmpfs none /mnt 2>/dev/null; then probe mount done; umount /mnt; else probe mount "refused:$(mount -t tmpfs none /mnt 2>&1 | tr ' ' _)"; fi
probe keyctl "$(perl -e 'my $r = syscall(250, 0, -4, 0); print $r < 0 ? "refused:" . ($! + 0) : "allowed"')"
probe uid_map "$(tr -s ' ' _ < /proc/self/uid_map)"
probe personality_aslr_off "$(perl -e 'my $r = syscall(135, 0x80040000); print $r < 0 ? "refused:" . ($! + 0) : "allowed"')"
probe personality_query "$(perl -e 'my $r = syscall(135, 0xffffffff); print $r < 0 ? "refused:" . ($! + 0) : "allowed"')"
probe linux32 "$(setarch linux32 uname -m 2>&1 | tr ' ' _)"
probe cgroup "$(tr '\n' ',' < /proc/self/cgroup)"
probe mountinfo "$(sha256sum < /proc/self/mountinfo | cut -c1-16)"
probe mountinfo_host "$(grep -c -e /var/lib -e /tmp/ -e sbx- /proc/self/mountinfo)"
probe caps "$(grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status | tr -d ' \t' | tr '\n' ,)"
probe kcore "$(wc -c < /proc/kcore 2>/dev/null || echo none)"
probe sys "$(ls /sys 2>/dev/null | wc -l)"
probe dev "$(ls /dev | tr '\n' ,)"
touch /made-by-root && probe made "$(stat -c %u:%g /made-by-root)"
"""


def probes(messages):
    found = {}
    for m in messages:
        hit = re.search(r"PROBE (\S+) (.*)$", m)
        if hit:
            found[hit.group(1)] = hit.group(2).strip()
    return found


def build(tpl, name, opts):
    logs = []
    Template.build(tpl, name, on_build_logs=logs.append, **opts)
    return [entry.message for entry in logs]


def hostile(nonce, then=None):
    tpl = (
        Template()
        .from_image("e2bdev/base")
        .run_cmd(f"echo {nonce} > /tmp/nonce")
        .run_cmd(PROBES, user="root")
    )
    return then(tpl) if then else tpl


def test_a_root_step_cannot_reach_the_host(strata, team):
    team_name, opts = team
    messages = build(hostile(uuid.uuid4().hex), "hostile", opts)
    p = probes(messages)
    assert p["core_pattern"] == "refused", messages
    assert p["sysrq"] == "refused", messages
    assert p["userns"].startswith("refused") and "Operation_not_permitted" in p["userns"], p["userns"]
    assert p["mount"].startswith("refused"), p["mount"]
    # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING), the call `keyctl show` starts
    # with (x86_64 number 250; perl is in every Debian image, keyutils is not): EPERM.
    assert p["keyctl"] == "refused:1", p["keyctl"]
    assert p["uid_map"] == f"_0_{ID_BASE}_65536", p["uid_map"]
    # personality (x86_64 number 135): Docker's allow-list. ADDR_NO_RANDOMIZE (ASLR off) under
    # bit 31 passed the earlier per-flag rule; the query and 32-bit Linux still work.
    assert p["personality_aslr_off"] == "refused:1", p["personality_aslr_off"]
    assert p["personality_query"] == "allowed", p["personality_query"]
    assert p["linux32"] == "i686", p["linux32"]
    assert all(line.endswith(":/") for line in p["cgroup"].strip(",").split(",")), p["cgroup"]
    assert p["mountinfo_host"] == "0", p["mountinfo_host"]
    caps = dict(kv.split(":") for kv in p["caps"].strip(",").split(","))
    assert caps == {
        "CapInh": NO_CAPS,
        "CapPrm": SANDBOX_CAPS,
        "CapEff": SANDBOX_CAPS,
        "CapBnd": SANDBOX_CAPS,
        "CapAmb": NO_CAPS,
    }, caps
    assert p["kcore"] in ("0", "none"), p["kcore"]
    assert p["sys"] == "0", p["sys"]
    assert set(p["dev"].strip(",").split(",")) <= {
        "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
        "fd", "stdin", "stdout", "stderr",
    }, p["dev"]
    # Root in the step made the file; on the host it belongs to the sandbox id range, and
    # inside the sandbox it is root's.
    assert p["made"] == "0:0", p["made"]
    trees = list((strata.data_dir / "layers").glob("*/made-by-root"))
    assert trees, "the step's layer is in the node's layer cache"
    for tree in trees:
        st = tree.stat()
        assert (st.st_uid, st.st_gid) == (ID_BASE, ID_BASE), (tree, st.st_uid)


def test_the_identity_a_step_sees_is_the_same_cold_and_resumed(strata, team):
    team_name, opts = team
    nonce = uuid.uuid4().hex
    cold = probes(build(hostile(nonce), "identity", opts))
    # A later step changes: the probe step is resumed from its checkpoint, then a new step
    # probes again on the longer stack of the resumed build.
    resumed_messages = build(hostile(nonce, lambda t: t.run_cmd(PROBES, user="root")), "identity", opts)
    resumed = probes(resumed_messages)
    assert any("CACHED" in m for m in resumed_messages), resumed_messages
    assert resumed["cgroup"] == cold["cgroup"], (cold, resumed)
    assert resumed["mountinfo_host"] == "0"


def test_sudo_from_the_default_user_is_root_inside_only(strata, team):
    team_name, opts = team
    tpl = (
        Template()
        .from_image("e2bdev/base")
        .run_cmd(
            "sudo -n true && echo 'PROBE sudo ok'; "
            "echo \"PROBE user_caps $(grep CapEff /proc/self/status | tr -d ' \\t')\"; "
            "echo \"PROBE sudo_caps $(sudo -n grep CapEff /proc/self/status | tr -d ' \\t')\"; "
            "sudo -n sh -c 'cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern' 2>/dev/null "
            "&& echo 'PROBE sudo_core_pattern written' || echo 'PROBE sudo_core_pattern refused'"
        )
        .set_start_cmd("grep -E '^Cap(Eff|Bnd|Amb)' /proc/self/status > /tmp/start-caps; sleep 1", "test -s /tmp/start-caps")
    )
    p = probes(build(tpl, "sudo", opts))
    assert p["sudo"] == "ok"
    assert p["user_caps"] == f"CapEff:{NO_CAPS}"
    assert p["sudo_caps"] == f"CapEff:{SANDBOX_CAPS}"
    assert p["sudo_core_pattern"] == "refused"
    # The start command ran with the same set, and so does `strata template exec`.
    start = exec_in(strata, team_name, "sudo", "tr -d ' \\t' < /tmp/start-caps")
    assert start.split() == [f"CapEff:{NO_CAPS}", f"CapBnd:{SANDBOX_CAPS}", f"CapAmb:{NO_CAPS}"], start
    # `template exec` runs as the template's user, and its root is the sandbox's root.
    execd = exec_in(
        strata,
        team_name,
        "sudo",
        "grep -E '^Cap(Eff|Bnd|Amb)' /proc/self/status | tr -d ' \\t'; sudo -n grep CapEff /proc/self/status | tr -d ' \\t'",
    )
    assert execd.split() == [
        f"CapEff:{NO_CAPS}",
        f"CapBnd:{SANDBOX_CAPS}",
        f"CapAmb:{NO_CAPS}",
        f"CapEff:{SANDBOX_CAPS}",
    ], execd
