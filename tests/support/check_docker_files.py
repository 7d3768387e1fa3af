#!/usr/bin/python3
"""Static checks of docker/compose.yaml, docker/Dockerfile and docker/rabbitmq.conf.

Usage: /usr/bin/python3 tests/support/check_docker_files.py REPO_ROOT

No Docker engine needed. Checks that compose.yaml parses and has its services, that every
host path it names (bind mounts, build context, dockerfile) exists relative to the right
base directory, that the Dockerfile has a build and a runtime stage, that every COPY source
exists in the build context and is not excluded by .dockerignore, that COPY --from names an
earlier stage, that the runtime stage installs no -dev package and runs as a non-root user,
and that the definitions rabbitmq.conf loads (a file, or a directory whose files are imported
one by one in name order) are mounted there, include definitions/definitions.json, declare
each vhost before it is used, and define the consumer's user with the password and the vhost
permissions of its LAPSE_AMQP_URL.
Prints one line per check; exits 1 with one line per problem.
"""

import base64
import fnmatch
import glob
import hashlib
import json
import os
import re
import shlex
import sys
import urllib.parse

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    print("check_docker_files: python3-yaml is not installed (run scripts/setup)", file=sys.stderr)
    sys.exit(1)

REQUIRED_SERVICES = ("rabbitmq", "lapse-consumer")

problems = []


def ok(msg):
    print(f"ok: {msg}")


def problem(msg):
    problems.append(msg)
    print(f"PROBLEM: {msg}")


def rel(path, root):
    return os.path.relpath(path, root)


# ---------------------------------------------------------------------------------------
# Dockerfile parsing: logical lines (continuations joined, comments dropped), then stages.


def dockerfile_instructions(text):
    """Yield (lineno, INSTRUCTION, rest) for each logical line."""
    buf, start = "", 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker too
        if not buf:
            start = lineno
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        parts = buf.strip().split(None, 1)
        yield start, parts[0].upper(), parts[1] if len(parts) > 1 else ""
        buf = ""
    if buf:
        parts = buf.strip().split(None, 1)
        yield start, parts[0].upper(), parts[1] if len(parts) > 1 else ""


def split_stages(instructions):
    stages = []
    for lineno, instr, rest in instructions:
        if instr == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append({"line": lineno, "image": words[0] if words else "", "name": name,
                           "body": []})
        elif stages:
            stages[-1]["body"].append((lineno, instr, rest))
        elif instr != "ARG":
            problem(f"Dockerfile line {lineno}: {instr} before the first FROM")
    return stages


def copy_args(rest):
    """Return (options, sources, dest) of a COPY/ADD instruction."""
    rest = rest.strip()
    opts = {}
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        key, _, value = word[2:].partition("=")
        opts[key] = value
        rest = rest.strip()
    if rest.startswith("["):
        words = json.loads(rest)
    else:
        words = shlex.split(rest)
    return opts, words[:-1], words[-1] if words else ""


def load_dockerignore(context):
    path = os.path.join(context, ".dockerignore")
    if not os.path.isfile(path):
        return []
    pats = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                pats.append(line)
    return pats


def ignored(relpath, patterns):
    """Docker's rule, simplified: the last matching pattern wins, '!' re-includes; a
    pattern matching a parent directory excludes everything below it."""
    relpath = os.path.normpath(relpath)
    if relpath == ".":
        return False
    parts = relpath.split(os.sep)
    prefixes = [os.sep.join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pat in patterns:
        neg = pat.startswith("!")
        p = os.path.normpath(pat[1:] if neg else pat).lstrip("/")
        if p.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(x, p[3:]) for x in parts) or fnmatch.fnmatchcase(relpath, p)
        else:
            hit = any(fnmatch.fnmatchcase(pre, p) for pre in prefixes)
        if hit:
            result = not neg
    return result


def check_dockerfile(dockerfile, context):
    try:
        with open(dockerfile, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        problem(f"cannot read {dockerfile}: {e.strerror}")
        return
    stages = split_stages(list(dockerfile_instructions(text)))
    if len(stages) < 2:
        problem(f"Dockerfile has {len(stages)} FROM stage(s); a build and a runtime stage are needed")
        return
    ok(f"Dockerfile has {len(stages)} stages: "
       + ", ".join(f"{s['image']} as {s['name'] or '#' + str(i)}" for i, s in enumerate(stages)))

    patterns = load_dockerignore(context)
    seen_names = set()
    for i, stage in enumerate(stages):
        for lineno, instr, rest in stage["body"]:
            if instr not in ("COPY", "ADD"):
                continue
            opts, sources, _dest = copy_args(rest)
            if "from" in opts:
                src_stage = opts["from"]
                if src_stage in seen_names or (src_stage.isdigit() and int(src_stage) < i):
                    ok(f"Dockerfile line {lineno}: {instr} --from={src_stage} names an earlier stage")
                elif "/" in src_stage or ":" in src_stage:
                    ok(f"Dockerfile line {lineno}: {instr} --from={src_stage} (an image)")
                else:
                    problem(f"Dockerfile line {lineno}: {instr} --from={src_stage}: no earlier stage of that name")
                continue
            for src in sources:
                if re.match(r"^[a-z]+://", src):
                    continue
                path = os.path.join(context, src)
                matches = glob.glob(path) if any(c in src for c in "*?[") else [path]
                if not matches or not all(os.path.exists(m) for m in matches):
                    problem(f"Dockerfile line {lineno}: {instr} source '{src}' does not exist in the "
                            f"build context {context}")
                elif ignored(os.path.relpath(path, context), patterns):
                    problem(f"Dockerfile line {lineno}: {instr} source '{src}' is excluded by "
                            f"{os.path.join(context, '.dockerignore')}")
                else:
                    ok(f"Dockerfile line {lineno}: {instr} source '{src}' exists in the build context")
        if stage["name"]:
            seen_names.add(stage["name"])

    runtime = stages[-1]
    dev = []
    user = None
    for lineno, instr, rest in runtime["body"]:
        if instr == "RUN":
            for m in re.finditer(r"\b(?:apt-get|apt)\s+install\b(.*?)(?:&&|;|\|\||$)", rest):
                for word in m.group(1).split():
                    name = word.split("=")[0].split(":")[0]
                    if not word.startswith("-") and (name.endswith("-dev") or name.endswith("-dbg")):
                        dev.append(f"{word} (line {lineno})")
        elif instr == "USER":
            user = rest.strip()
    if dev:
        problem("the runtime stage installs development packages: " + ", ".join(dev))
    else:
        ok(f"the runtime stage ({runtime['image']}) installs no -dev package")
    if user is None:
        problem("the runtime stage has no USER: the consumer would run as root")
    elif user.split(":")[0] in ("root", "0"):
        problem(f"the runtime stage runs as {user}")
    else:
        ok(f"the runtime stage runs as USER {user}")


# ---------------------------------------------------------------------------------------
# compose.yaml


def is_host_path(src):
    return src.startswith((".", "/", "~"))


def parse_volume(vol):
    """Return (kind, source, target) for a short- or long-syntax service volume."""
    if isinstance(vol, str):
        # SOURCE:TARGET[:MODE] or just TARGET (anonymous volume)
        parts = vol.split(":")
        if len(parts) == 1:
            return "anonymous", None, parts[0]
        kind = "bind" if is_host_path(parts[0]) else "volume"
        return kind, parts[0], parts[1]
    if isinstance(vol, dict):
        return vol.get("type", "volume"), vol.get("source"), vol.get("target")
    return None, None, None


def read_conf_value(path, keys):
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if "=" in line:
                    k, v = (s.strip() for s in line.split("=", 1))
                    if k in keys:
                        return k, v
    except OSError:
        pass
    return None, None


DEFINITIONS_KEYS = ("load_definitions", "management.load_definitions", "definitions.local.path")


def service_env(svc):
    env = (svc or {}).get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env if "=" in e)
    return env


def secret_file(compose, compose_dir, svc, path):
    """The host file behind a service's /run/secrets/NAME, or None."""
    m = re.match(r"^/run/secrets/([^/]+)$", path or "")
    if not m:
        return None
    names = [x if isinstance(x, str) else (x or {}).get("source") for x in svc.get("secrets") or []]
    if m.group(1) not in names:
        problem(f"lapse-consumer: {path} names secret '{m.group(1)}', which the service does "
                f"not list under secrets:")
        return None
    sec = (compose.get("secrets") or {}).get(m.group(1)) or {}
    if "file" not in sec:
        problem(f"secret '{m.group(1)}' has no file: in compose.yaml's top-level secrets:")
        return None
    return os.path.normpath(os.path.join(compose_dir, sec["file"]))


def consumer_login(services, compose=None, compose_dir="."):
    """(user, password, vhost) of the lapse-consumer's LAPSE_AMQP_URL (the password from
    LAPSE_AMQP_PASSWORD_FILE when that names a compose secret), or None."""
    consumer = services.get("lapse-consumer") or {}
    env = service_env(consumer)
    url = env.get("LAPSE_AMQP_URL", "")
    m = re.match(r"^amqps?://(?:([^:@/]*)(?::([^@/]*))?@)?[^/]*(?:/(.*))?$", url)
    if not m:
        problem(f"lapse-consumer: LAPSE_AMQP_URL '{url}' is not an amqp:// URL")
        return None
    user = urllib.parse.unquote(m.group(1)) if m.group(1) else "guest"
    password = urllib.parse.unquote(m.group(2)) if m.group(2) is not None else "guest"
    vhost = "/" if m.group(3) is None else urllib.parse.unquote(m.group(3))
    pw_file = env.get("LAPSE_AMQP_PASSWORD_FILE")
    if pw_file:
        host = secret_file(compose or {}, compose_dir, consumer, pw_file)
        if host is None:
            if not pw_file.startswith("/run/secrets/"):
                problem(f"lapse-consumer: LAPSE_AMQP_PASSWORD_FILE {pw_file} is not a "
                        f"/run/secrets/ path this check can follow")
            return None
        try:
            with open(host, encoding="utf-8") as f:
                password = f.read()
            # As lapse reads it: one final newline (\n or \r\n) dropped, no more.
            for end in ("\r\n", "\n"):
                if password.endswith(end):
                    password = password[: -len(end)]
                    break
        except OSError as e:
            problem(f"lapse-consumer: the password file's secret {host} cannot be read: "
                    f"{e.strerror}")
            return None
        ok(f"lapse-consumer: the password comes from the secret file {os.path.basename(host)}")
    return user, password, vhost


def password_matches(user_def, password):
    """True/False when the definition's password can be checked against PASSWORD, None when
    its hashing algorithm is not one we know."""
    if "password" in user_def:
        return user_def["password"] == password
    algo = user_def.get("hashing_algorithm", "rabbit_password_hashing_sha256")
    funcs = {"rabbit_password_hashing_sha256": hashlib.sha256,
             "rabbit_password_hashing_sha512": hashlib.sha512,
             "rabbit_password_hashing_md5": hashlib.md5}
    if algo not in funcs:
        return None
    try:
        raw = base64.b64decode(user_def.get("password_hash", ""), validate=True)
    except ValueError:
        return False
    salt, digest = raw[:4], raw[4:]
    return len(raw) > 4 and funcs[algo](salt + password.encode()).digest() == digest


def definitions_files(key, path, mounts, root, conf_name):
    """The files a broker reads for `KEY = PATH`, as [(container path, host path)] in the
    order it imports them, or None when PATH is not mounted."""
    if path in mounts and not os.path.isdir(mounts[path]):
        ok(f"{conf_name}: {key} = {path} is mounted from {rel(mounts[path], root)}")
        return [(path, mounts[path])]
    # A directory: the broker imports every file in it, one at a time, in name order.
    files = {}
    if path in mounts:
        for name in os.listdir(mounts[path]):
            host = os.path.join(mounts[path], name)
            if os.path.isfile(host):
                files[name] = host
    inside = {t: h for t, h in mounts.items()
              if os.path.dirname(t.rstrip("/")) == path.rstrip("/")}
    for target, host in inside.items():
        if os.path.isdir(host):
            problem(f"{conf_name}: {target} inside the definitions directory {path} is a "
                    f"directory ({rel(host, root)}); the broker reads only files there")
        else:
            files[os.path.basename(target)] = host
    if not files:
        problem(f"{conf_name}: {key} = {path}, but no volume of the rabbitmq service mounts "
                f"that path or any file in it")
        return None
    if key == "definitions.local.path":
        problem(f"{conf_name}: {key} = {path} names a directory; RabbitMQ 3.10 fails to boot "
                f"with eisdir there: use load_definitions = {path}")
    order = sorted(files)
    ok(f"{conf_name}: {key} = {path} is a directory of {len(order)} mounted file(s), imported "
       f"in this order: " + ", ".join(f"{n} (from {rel(files[n], root)})" for n in order))
    return [(os.path.join(path, n), files[n]) for n in order]


def check_boot_definitions(files, root, services, compose=None, compose_dir="."):
    """A node that imports definitions on its first boot creates neither the default vhost
    nor the guest user (observed on 3.10.8: boot fails with {no_such_vhost,<<"/">>} when the
    definitions declare queues in "/" without declaring "/"). The files are imported one by
    one, in order, and boot stops at the first that fails (observed on 3.10.8 with a
    directory of files). So each vhost must be declared in the file that first uses it or in
    an earlier one, and the files together must define the user the consumer logs in as,
    with its password and permissions on its vhost."""
    vhosts, users, perms = set(), {}, {}
    topology = os.path.join(root, "definitions", "definitions.json")
    loaded_topology = False
    for target, host in files:
        name = rel(host, root)
        loaded_topology |= os.path.normpath(host) == os.path.normpath(topology)
        try:
            with open(host, encoding="utf-8") as f:
                defs = json.load(f)
        except OSError:
            return  # reported as a missing bind mount source already
        except ValueError as e:
            problem(f"{name} (at {target}) is not valid JSON: {e}")
            return
        if not isinstance(defs, dict):
            problem(f"{name} (at {target}) is not a JSON object")
            return
        vhosts |= {v.get("name") for v in defs.get("vhosts") or [] if isinstance(v, dict)}
        used = set()
        for kind in ("exchanges", "queues", "bindings", "policies", "parameters", "permissions",
                     "topic_permissions"):
            for item in defs.get(kind) or []:
                if isinstance(item, dict) and "vhost" in item:
                    used.add(item["vhost"])
        missing = sorted(used - vhosts)
        if missing:
            problem(f"{name} (at {target}) uses vhost(s) {missing} that neither it nor an "
                    f"earlier definitions file declares under \"vhosts\": a broker importing "
                    f"it on first boot creates no default vhost and fails to boot")
        elif used:
            ok(f"{name} (at {target}): vhost(s) {sorted(used)} declared by then")
        for u in defs.get("users") or []:
            if isinstance(u, dict) and "name" in u:
                users[u["name"]] = (u, name)
        for p_ in defs.get("permissions") or []:
            if isinstance(p_, dict):
                perms[(p_.get("user"), p_.get("vhost"))] = (p_, name)
    if not loaded_topology:
        problem(f"the broker's definitions do not include {rel(topology, root)} (the "
                f"`lapse topology export` output)")

    login = consumer_login(services, compose, compose_dir)
    if login is None:
        return
    user, password, vhost = login
    if user not in users:
        problem(f"no definitions file defines user '{user}' (the lapse-consumer's login): a "
                f"broker importing definitions on first boot creates no guest user, so the "
                f"consumer cannot log in")
        return
    udef, uname = users[user]
    match = password_matches(udef, password)
    if match is False:
        problem(f"{uname}: the password of user '{user}' is not the one in the "
                f"lapse-consumer's LAPSE_AMQP_URL")
    elif match is None:
        ok(f"{uname}: user '{user}' uses hashing algorithm {udef.get('hashing_algorithm')}; "
           f"its password is not checked")
    else:
        ok(f"{uname}: user '{user}' has the password of the lapse-consumer's LAPSE_AMQP_URL")
    if (user, vhost) not in perms:
        problem(f"no definitions file gives user '{user}' permissions on vhost '{vhost}' (the "
                f"lapse-consumer's LAPSE_AMQP_URL)")
        return
    pdef, pname = perms[(user, vhost)]
    # Least privilege: each role user of the broker has exactly its role's permissions of
    # definitions/roles.json (`lapse topology export --roles`), the consumer's login too.
    with open(os.path.join(root, "definitions", "roles.json"), encoding="utf-8") as f:
        roles = {p_["user"]: p_ for p_ in json.load(f)["permissions"]}
    want = roles.get("lapse-consumer")
    diff = [k for k in ("configure", "write", "read") if pdef.get(k) != want.get(k)]
    if diff:
        problem(f"{pname}: user '{user}' (the consumer's login) has {'/'.join(diff)} "
                f"permission(s) other than the consumer role's in definitions/roles.json")
    else:
        ok(f"{pname} gives user '{user}' exactly the consumer role's permissions")
    for (u, vh), (p_, n_) in perms.items():
        if u in roles:
            if any(p_.get(k) != roles[u].get(k) for k in ("configure", "write", "read")):
                problem(f"{n_}: user '{u}' has permissions other than definitions/roles.json's")
            else:
                ok(f"{n_}: user '{u}' has its role's permissions")
    for u, (udef, n_) in users.items():
        if "administrator" in (udef.get("tags") or []):
            problem(f"{n_}: user '{u}' is an administrator; no role needs that")


def check_hardening(services, mounts):
    """The consumer runs read-only, without capabilities or privilege gains, with a
    healthcheck; the broker image is pinned to one version of a supported series; the
    broker refuses oversized messages."""
    consumer = services.get("lapse-consumer") or {}
    if consumer.get("read_only") is True:
        ok("lapse-consumer: read_only root file system")
    else:
        problem("lapse-consumer: no read_only: true")
    if "ALL" in (consumer.get("cap_drop") or []):
        ok("lapse-consumer: cap_drop ALL")
    else:
        problem("lapse-consumer: cap_drop does not drop ALL")
    if any(str(o).replace("=", ":") in ("no-new-privileges:true", "no-new-privileges")
           for o in consumer.get("security_opt") or []):
        ok("lapse-consumer: no-new-privileges")
    else:
        problem("lapse-consumer: no security_opt no-new-privileges:true")
    test = (consumer.get("healthcheck") or {}).get("test") or []
    if test[:3] == ["CMD", "lapse", "health"]:
        ok("lapse-consumer: healthcheck runs `lapse health`")
        if not service_env(consumer).get("LAPSE_METRICS_LISTEN"):
            problem("lapse-consumer: `lapse health` needs LAPSE_METRICS_LISTEN in the environment")
    else:
        problem(f"lapse-consumer: healthcheck is {test!r}, not [CMD, lapse, health]")
    image = (services.get("rabbitmq") or {}).get("image", "")
    m = re.match(r"^rabbitmq:(\d+)\.(\d+)\.(\d+)(-management)?$", image)
    if not m:
        problem(f"rabbitmq: image '{image}' is not pinned to one version (rabbitmq:X.Y.Z-management)")
    elif int(m.group(1)) < 4:
        problem(f"rabbitmq: image '{image}' is a 3.x series, past its end of support")
    else:
        ok(f"rabbitmq: image pinned to {image}")
    conf = next((h for t, h in mounts.items() if t.endswith("rabbitmq.conf")), None)
    _, size = read_conf_value(conf, ("max_message_size",)) if conf else (None, None)
    if size is None or not size.isdigit() or int(size) < 32768 or int(size) > 16 << 20:
        problem(f"rabbitmq.conf: max_message_size is {size!r}; set one between 32 KiB (a "
                f"parked message) and 16 MiB")
    else:
        ok(f"rabbitmq.conf: max_message_size = {size}")


def main(argv):
    if len(argv) != 2:
        print("usage: check_docker_files.py REPO_ROOT", file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    compose_path = os.path.join(root, "docker", "compose.yaml")
    compose_dir = os.path.dirname(compose_path)

    try:
        with open(compose_path, encoding="utf-8") as f:
            compose = yaml.safe_load(f)
    except OSError as e:
        problem(f"cannot read {rel(compose_path, root)}: {e.strerror}")
        return 1
    except yaml.YAMLError as e:
        problem(f"{rel(compose_path, root)} is not valid YAML: {e}")
        return 1
    if not isinstance(compose, dict) or not isinstance(compose.get("services"), dict):
        problem(f"{rel(compose_path, root)} has no 'services' mapping")
        return 1
    ok(f"{rel(compose_path, root)} parses as YAML")

    services = compose["services"]
    declared_volumes = compose.get("volumes") or {}
    for name in REQUIRED_SERVICES:
        if name in services:
            ok(f"service '{name}' exists")
        else:
            problem(f"service '{name}' is missing from compose.yaml")

    mounts = {}  # container target -> host source (bind mounts of the rabbitmq service)
    for sname, svc in services.items():
        if not isinstance(svc, dict):
            problem(f"service '{sname}' is not a mapping")
            continue
        if "image" not in svc and "build" not in svc:
            problem(f"service '{sname}' has neither image nor build")
        for vol in svc.get("volumes") or []:
            kind, src, target = parse_volume(vol)
            if kind == "bind":
                host = os.path.normpath(os.path.join(compose_dir, os.path.expanduser(src)))
                if os.path.exists(host):
                    ok(f"service '{sname}': bind mount {src} -> {target}: {rel(host, root)} exists")
                else:
                    problem(f"service '{sname}': bind mount source {src} -> {target}: "
                            f"{rel(host, root)} does not exist")
                if sname == "rabbitmq":
                    mounts[target] = host
            elif kind == "volume":
                if src in declared_volumes:
                    ok(f"service '{sname}': named volume '{src}' is declared")
                else:
                    problem(f"service '{sname}': named volume '{src}' is not declared under volumes:")
            elif kind is None:
                problem(f"service '{sname}': cannot read volume entry {vol!r}")

        build = svc.get("build")
        if build is not None:
            if isinstance(build, str):
                build = {"context": build}
            context = os.path.normpath(os.path.join(compose_dir, build.get("context", ".")))
            if not os.path.isdir(context):
                problem(f"service '{sname}': build context {build.get('context')} "
                        f"({rel(context, root)}) is not a directory")
                continue
            ok(f"service '{sname}': build context {build.get('context', '.')} is {rel(context, root) or '.'}")
            dockerfile = os.path.normpath(os.path.join(context, build.get("dockerfile", "Dockerfile")))
            if not os.path.isfile(dockerfile):
                problem(f"service '{sname}': dockerfile {build.get('dockerfile', 'Dockerfile')} "
                        f"({rel(dockerfile, root)}) does not exist (relative to the build context)")
                continue
            ok(f"service '{sname}': dockerfile {rel(dockerfile, root)} exists")
            check_dockerfile(dockerfile, context)

        deps = svc.get("depends_on") or {}
        if isinstance(deps, dict):
            for dep, cond in deps.items():
                if dep not in services:
                    problem(f"service '{sname}' depends on unknown service '{dep}'")
                elif (cond or {}).get("condition") == "service_healthy" \
                        and "healthcheck" not in services[dep]:
                    problem(f"service '{sname}' waits for '{dep}' to be healthy, which has no healthcheck")
                else:
                    ok(f"service '{sname}' depends on '{dep}' ({(cond or {}).get('condition', 'started')})")
        elif isinstance(deps, list):
            for dep in deps:
                if dep not in services:
                    problem(f"service '{sname}' depends on unknown service '{dep}'")

    # The definitions rabbitmq.conf tells the broker to load must be mounted there.
    conf_target = next((t for t in mounts if t.endswith("rabbitmq.conf")), None)
    if conf_target:
        conf_name = rel(mounts[conf_target], root)
        key, path = read_conf_value(mounts[conf_target], DEFINITIONS_KEYS)
        if path is None:
            ok(f"{conf_name} loads no definitions")
        else:
            files = definitions_files(key, path, mounts, root, conf_name)
            if files:
                check_boot_definitions(files, root, services, compose, compose_dir)

    check_hardening(services, mounts)

    if problems:
        print(f"check_docker_files: {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print("check_docker_files: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
