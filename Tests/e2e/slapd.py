"""A throwaway OpenLDAP directory for the fleet tests and bench: Debian's slapd, configured
through cn=config from scratch (with ldap/boxkey.ldif, the schema Boxkey ships), TLS with a
CA made for the run, and the access rules docs/fleet.md recommends: the boxes' service
account reads everything and writes only boxkeyPhone; users cannot write boxkeyPhone."""
import os
import socket
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def documented_rules():
    """docs/fleet.md's access rules and limits, exactly as printed (one source: what the doc
    tells admins to load is what the tests run)."""
    text = open(os.path.join(REPO, "docs", "fleet.md")).read()
    block = text.split("### Access rules", 1)[1].split("```\n", 2)[1]
    assert "olcAccess: to attrs=userPassword" in block
    return block.replace("dc=example,dc=org", SUFFIX)


def documented_syncprov():
    """docs/fleet.md's syncprov overlay entry, exactly as printed."""
    text = open(os.path.join(REPO, "docs", "fleet.md")).read()
    block = text.split("### Following changes", 1)[1].split("```\n", 2)[1]
    assert "olcOverlay: syncprov" in block
    return block
SUFFIX = "dc=example,dc=org"
PEOPLE = f"ou=people,{SUFFIX}"
ADMIN_DN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "directory admin secret"
BOX_DN = f"cn=boxes,ou=services,{SUFFIX}"
BOX_PASSWORD = "the boxes' bind secret"
FLEET_DN = f"cn=boxkey,ou=services,{SUFFIX}"
# Users' own passwords: they bind as themselves in the tests of the access rules.
USER_PASSWORD = "a user's directory password"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slapd:
    def __init__(self, work, users=("alice", "bob"), extra_users=0, posix=None, syncprov=True):
        """posix: {name: uid number} of users that are also posixAccounts (sssd's users).
        syncprov: with the content synchronisation overlay boxes follow (docs/fleet.md)."""
        self.syncprov = syncprov
        self.posix = posix or {}
        self.dir = os.path.join(work, "slapd")
        os.makedirs(os.path.join(self.dir, "db"))
        os.makedirs(os.path.join(self.dir, "slapd.d"))
        self.port = free_port()
        self.uri = f"ldap://127.0.0.1:{self.port}/"
        self.log = os.path.join(self.dir, "slapd.log")
        self.process = None
        self._tls()
        self._configure()
        self._populate(users, extra_users)
        for name, secret in (("admin", ADMIN_PASSWORD), ("boxes", BOX_PASSWORD)):
            path = os.path.join(self.dir, f"{name}.password")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(secret + "\n")
        self.admin_password_file = os.path.join(self.dir, "admin.password")
        self.box_password_file = os.path.join(self.dir, "boxes.password")

    def _run(self, *args, input=None):
        r = subprocess.run(args, input=input, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{args[0]}: {r.stdout}{r.stderr}"
        return r.stdout

    def _tls(self):
        d = self.dir
        self.ca = os.path.join(d, "ca.pem")
        self._run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                  "-subj", "/CN=Boxkey test CA", "-keyout", os.path.join(d, "ca.key"), "-out", self.ca)
        self._run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1",
                  "-keyout", os.path.join(d, "server.key"), "-out", os.path.join(d, "server.csr"))
        with open(os.path.join(d, "san.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        self._run("openssl", "x509", "-req", "-in", os.path.join(d, "server.csr"), "-CA", self.ca, "-CAkey", os.path.join(d, "ca.key"),
                  "-CAcreateserial", "-days", "2", "-extfile", os.path.join(d, "san.ext"), "-out", os.path.join(d, "server.pem"))

    def _configure(self):
        d = self.dir
        config = f"""dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: {d}/slapd.pid
olcTLSCACertificateFile: {d}/ca.pem
olcTLSCertificateFile: {d}/server.pem
olcTLSCertificateKeyFile: {d}/server.key

dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb
olcModuleLoad: syncprov

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file:///etc/ldap/schema/core.ldif
include: file:///etc/ldap/schema/cosine.ldif
include: file:///etc/ldap/schema/nis.ldif
include: file:///etc/ldap/schema/inetorgperson.ldif
include: file://{REPO}/ldap/boxkey.ldif

dn: olcDatabase={{-1}}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {{-1}}frontend

dn: olcDatabase={{0}}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {{0}}config
olcAccess: to * by * none

dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {SUFFIX}
olcRootDN: {ADMIN_DN}
olcRootPW: {ADMIN_PASSWORD}
olcDbDirectory: {d}/db
olcDbMaxSize: 1073741824
olcDbIndex: objectClass eq
olcDbIndex: uid eq
olcDbIndex: boxkeyPhone eq,pres
olcDbIndex: entryCSN,entryUUID eq
olcSecurity: tls=1
{documented_rules()}
""" + ("\n" + documented_syncprov() if self.syncprov else "")
        self._run("slapadd", "-n0", "-F", os.path.join(d, "slapd.d"), input=config)

    def _populate(self, users, extra_users):
        entries = [f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example\n",
                   f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n",
                   f"dn: ou=services,{SUFFIX}\nobjectClass: organizationalUnit\nou: services\n",
                   f"dn: {BOX_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: boxes\nuserPassword: {BOX_PASSWORD}\n",
                   f"dn: {FLEET_DN}\nobjectClass: organizationalRole\nobjectClass: boxkeyFleet\ncn: boxkey\n"]
        names = list(users) + [n for n in self.posix if n not in users] + [f"user{n:05d}" for n in range(extra_users)]
        for name in names:
            posix = (f"objectClass: posixAccount\nuidNumber: {self.posix[name]}\ngidNumber: {self.posix[name]}\n"
                     f"homeDirectory: /home/{name}\nloginShell: /bin/bash\n") if name in self.posix else ""
            entries.append(f"dn: uid={name},{PEOPLE}\nobjectClass: inetOrgPerson\nobjectClass: boxkeyUser\n{posix}uid: {name}\ncn: {name}\nsn: {name}\n"
                           + (f"userPassword: {USER_PASSWORD}\n" if name in users or name in self.posix else ""))
        self._run("slapadd", "-q", "-n1", "-F", os.path.join(self.dir, "slapd.d"), input="\n".join(entries))

    def start(self):
        # -d stats: one line per operation (the bench counts searches); -d keeps it in the foreground.
        self.process = subprocess.Popen(["slapd", "-d", "stats", "-F", os.path.join(self.dir, "slapd.d"), "-h", self.uri],
                                        stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            assert self.process.poll() is None, open(self.log).read()[-3000:]
            time.sleep(0.05)
        raise AssertionError("slapd did not listen:\n" + open(self.log).read()[-3000:])

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        self.process = None

    def fleet_settings(self, **extra):
        """The [fleet] section of a box using this directory."""
        return dict({"uri": self.uri, "starttls": True, "ca_file": self.ca, "base": PEOPLE, "bind_dn": BOX_DN,
                     "bind_password_file": self.box_password_file, "revocations_dn": FLEET_DN}, **extra)

    def ldap(self, tool, *args, input=None, bind=(ADMIN_DN, ADMIN_PASSWORD)):
        """ldapsearch/ldapmodify over StartTLS, as the directory's admin by default."""
        env = dict(os.environ, LDAPTLS_CACERT=self.ca)
        r = subprocess.run([tool, "-ZZ", "-H", self.uri, "-x", "-D", bind[0], "-w", bind[1], *args], input=input,
                           capture_output=True, text=True, timeout=60, env=env)
        return r

    def phones(self, user):
        r = self.ldap("ldapsearch", "-LLL", "-b", PEOPLE, f"(uid={user})", "boxkeyPhone")
        assert r.returncode == 0, r.stderr
        return [line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith("boxkeyPhone: ")]

    def searches(self, roster=True):
        """How many searches slapd has served (roster=False: leaving out the boxes' reads of
        the roster, which run every refresh_s whatever else happens)."""
        lines = [l for l in open(self.log).read().splitlines() if " SRCH base=" in l]
        return len([l for l in lines if roster or "(boxkeyPhone=*)" not in l])
