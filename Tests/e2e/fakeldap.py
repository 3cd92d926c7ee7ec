"""A directory that lies: a few hundred lines of LDAP (RFC 4511) in BER on a Unix socket
(ldapi://, which the box takes without TLS), for attacks that a real slapd will not send.

It answers every bind with success and every plain search with no entries; what it answers to
the content-synchronisation search (RFC 4533) is the test's: `on_sync(message_id)` returns the
PDUs to send, made with the helpers below. It records what it was asked."""
import os
import socket
import threading

SYNC_REQUEST = "1.3.6.1.4.1.4203.1.9.1.1"
SYNC_STATE = "1.3.6.1.4.1.4203.1.9.1.2"
SYNC_INFO = "1.3.6.1.4.1.4203.1.9.1.4"
PAGED_RESULTS = "1.2.840.113556.1.4.319"
SYNC_ADD = 1
UUID = bytes(range(16))


def tlv(tag, content):
    n = len(content)
    if n < 0x80:
        length = bytes([n])
    else:
        raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(raw)]) + raw
    return bytes([tag]) + length + content


def octets(value, tag=0x04):
    return tlv(tag, value.encode() if isinstance(value, str) else value)


def integer(value, tag=0x02):
    return tlv(tag, value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big", signed=True))


def sequence(*parts, tag=0x30):
    return tlv(tag, b"".join(parts))


def message(message_id, op, controls=b""):
    return sequence(integer(message_id), op, controls)


def result(tag, code=0, text=""):
    return sequence(integer(code, tag=0x0A), octets(""), octets(text), tag=tag)


def control(oid, value=None):
    """A Control; value None: the control has no controlValue at all."""
    return sequence(octets(oid), b"" if value is None else octets(value))


def controls(*items):
    return sequence(*items, tag=0xA0)


def sync_state(state=SYNC_ADD, uuid=UUID):
    """A well-formed syncStateValue."""
    return sequence(integer(state, tag=0x0A), octets(uuid))


def plain_entry(message_id, dn, attributes, extra=b""):
    """A SearchResultEntry (`extra`: its controls, as `controls` makes them)."""
    attrs = sequence(*(sequence(octets(name), sequence(*(octets(v) for v in values), tag=0x31))
                       for name, values in attributes.items()))
    return message(message_id, sequence(octets(dn), attrs, tag=0x64), extra)


def entry(message_id, dn, attributes, state_value):
    """A SearchResultEntry with a Sync State control whose value is `state_value` (bytes; None:
    no value)."""
    return plain_entry(message_id, dn, attributes, controls(control(SYNC_STATE, state_value)))


def sync_info(message_id, value):
    """An IntermediateResponse carrying a syncInfoValue (bytes, as sent)."""
    return message(message_id, sequence(octets(SYNC_INFO, tag=0x80), octets(value, tag=0x81), tag=0x79))


def search_done(message_id, code=0, page_cookie=None):
    """The end of a search; with `page_cookie`, of one page, with more to come."""
    paged = b"" if page_cookie is None else controls(control(PAGED_RESULTS, sequence(integer(0), octets(page_cookie))))
    return message(message_id, result(0x65, code), paged)


class FakeDirectory:
    def __init__(self, work, on_sync=lambda message_id: [], endless_pages=False, entries_per_page=0):
        self.path = os.path.join(work, "fake-ldap.sock")
        self.uri = "ldapi://" + self.path.replace("/", "%2F")
        self.on_sync = on_sync
        self.endless_pages = endless_pages  # every page of a paged search says more are to come
        self.entries_per_page = entries_per_page  # entries in each page, whatever size was asked
        self.searches = 0  # searches other than the stream
        self.syncs = 0  # content-synchronisation searches asked for
        self.binds = 0
        self.ops = []  # every request's protocolOp tag, in order
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(16)
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def fleet_settings(self, work, **extra):
        password = os.path.join(work, "fake-ldap-password")
        with open(password, "w") as f:
            f.write("anything\n")
        os.chmod(password, 0o600)
        return dict({"uri": self.uri, "base": "ou=people,dc=example,dc=org", "bind_dn": "cn=box,dc=example,dc=org",
                     "bind_password_file": password, "timeout_s": 2}, **extra)

    def stop(self):
        self.stopping = True
        self.server.close()

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_pdu(conn):
        def exactly(n):
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise EOFError
                data += chunk
            return data
        head = exactly(2)
        n = head[1]
        if n & 0x80:  # the long form: libldap writes four length bytes
            length = exactly(n & 0x7F)
            head += length
            n = int.from_bytes(length, "big")
        return head + exactly(n)

    def _serve(self, conn):
        try:
            while True:
                pdu = self._read_pdu(conn)
                # LDAPMessage: SEQUENCE { messageID INTEGER, protocolOp, controls }
                i = 2 if pdu[1] < 0x80 else 2 + (pdu[1] & 0x7F)
                id_len = pdu[i + 1]
                message_id = int.from_bytes(pdu[i + 2:i + 2 + id_len], "big")
                op = pdu[i + 2 + id_len]
                self.ops.append(op)
                if op == 0x60:  # BindRequest
                    self.binds += 1
                    conn.sendall(message(message_id, result(0x61)))
                elif op == 0x63 and SYNC_REQUEST.encode() in pdu:  # the change stream
                    self.syncs += 1
                    for reply in self.on_sync(message_id):
                        conn.sendall(reply)
                elif op == 0x63:  # any other search: nothing found
                    self.searches += 1
                    paged = self.endless_pages and PAGED_RESULTS.encode() in pdu
                    if self.entries_per_page and PAGED_RESULTS.encode() in pdu:
                        one = plain_entry(message_id, "uid=x,ou=people,dc=example,dc=org", {"uid": ["x"]})
                        conn.sendall(one * self.entries_per_page)
                    conn.sendall(search_done(message_id, page_cookie=b"more" if paged else None))
                elif op == 0x42:  # UnbindRequest
                    return
                # AbandonRequest and the rest: no answer
        except (EOFError, OSError):
            pass
        finally:
            conn.close()
