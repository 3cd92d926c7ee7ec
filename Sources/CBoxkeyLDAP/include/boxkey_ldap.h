#ifndef BOXKEY_LDAP_H
#define BOXKEY_LDAP_H
/* The few libldap (OpenLDAP) calls boxkeyd needs for the fleet directory, over its synchronous
   API: connect (TLS or StartTLS, simple bind), a paged subtree search, and adding or deleting
   one attribute value. Each returns 0 or an LDAP result code, with a message in `err`. */
#include <stddef.h>

typedef struct ldap boxkey_ldap;

/* Connects to `uri` (ldaps://, ldap:// with starttls, or ldapi://), checks the server's
   certificate against `ca_file` (NULL: the system's store), and binds as `bind_dn` with
   `password` (both NULL: anonymous; over ldapi:// with bind_dn "EXTERNAL": SASL EXTERNAL).
   Every network wait is bounded by `timeout_s`. */
int boxkey_ldap_open(boxkey_ldap **out, const char *uri, int starttls, const char *ca_file,
                     const char *bind_dn, const char *password, int timeout_s,
                     char *err, size_t err_len);

/* One entry of a search: its DN, every value of `names_attr` (the login name: an entry with
   several is ambiguous), its uidNumber (NULL if none), and every value of `values_attr`.
   Returns 0 to go on, anything else to stop the search. */
typedef int (*boxkey_ldap_entry)(void *context, const char *dn, const char *const *names, int name_count,
                                 const char *number, const char *const *values, int count);

/* A subtree search under `base`, `page_size` entries per round trip (RFC 2696 paged results;
   0: unpaged). `*requests` counts the round trips. */
int boxkey_ldap_search(boxkey_ldap *ld, const char *base, const char *filter,
                       const char *names_attr, const char *values_attr, int page_size,
                       boxkey_ldap_entry each, void *context, int *requests,
                       char *err, size_t err_len);

enum { BOXKEY_LDAP_DELETE = 0, BOXKEY_LDAP_ADD = 1, BOXKEY_LDAP_REPLACE = 2 };

/* Deletes or adds one value of `attr` on `dn`, or replaces all its values with it. When writing
   to an entry whose classes do not allow `attr`, `object_class` (if not NULL: the auxiliary
   class that does) is added with it. */
int boxkey_ldap_change(boxkey_ldap *ld, const char *dn, int operation, const char *attr,
                       const char *value, const char *object_class, char *err, size_t err_len);

/* Replaces the value `old` of `attr` on `dn` with `value` in one modify (delete `old`, add
   `value`): if another writer changed it meanwhile, the delete fails and nothing is written.
   `old` NULL: the attribute must have no value yet. */
int boxkey_ldap_swap(boxkey_ldap *ld, const char *dn, const char *attr, const char *old,
                     const char *value, char *err, size_t err_len);

/* Content synchronisation (RFC 4533, OpenLDAP's syncprov overlay), refreshAndPersist: the
   server sends every entry matching `filter` under `base`, says when that refresh is done, and
   then sends each change as it happens, on the same connection, until the connection ends. */
enum { BOXKEY_LDAP_SYNC_REFRESHED = 100 };

/* One message of the stream: `state` is LDAP_SYNC_PRESENT/ADD/MODIFY (0-2: the entry as it is
   now), LDAP_SYNC_DELETE (3: gone, or no longer matching; no attributes), or
   BOXKEY_LDAP_SYNC_REFRESHED (the whole refresh has been sent; no entry). `uuid`: the entry's
   16-byte entryUUID, which survives renames. Returns 0 (anything else is ignored). */
typedef int (*boxkey_ldap_sync_change)(void *context, int state, const unsigned char *uuid, const char *dn,
                                       const char *const *names, int name_count, const char *number,
                                       const char *const *values, int count);

/* Starts the stream; `*msgid` names it for boxkey_ldap_sync_poll. */
int boxkey_ldap_sync_start(boxkey_ldap *ld, const char *base, const char *filter,
                           const char *names_attr, const char *values_attr, int *msgid,
                           char *err, size_t err_len);

/* Waits up to `timeout_ms` for the stream's next message, then hands it and those that have
   already arrived (at most `max_messages` in all) to `change`; `*handled` counts them (0: the
   wait ended with none). Returns 0,
   or the LDAP code when the stream ended or broke: LDAP_UNAVAILABLE_CRITICAL_EXTENSION when the
   server has no content synchronisation. */
int boxkey_ldap_sync_poll(boxkey_ldap *ld, int msgid, int timeout_ms, int max_messages, const char *names_attr,
                          const char *values_attr, boxkey_ldap_sync_change change, void *context,
                          int *handled, char *err, size_t err_len);

/* A base-scope read of `base` for no attributes: proves the connection and the server alive. */
int boxkey_ldap_ping(boxkey_ldap *ld, const char *base, char *err, size_t err_len);

/* The connection's socket (-1 if none): shutdown(2) on it from another thread wakes a
   boxkey_ldap_sync_poll that waits, which then fails. */
int boxkey_ldap_descriptor(boxkey_ldap *ld);

void boxkey_ldap_close(boxkey_ldap *ld);

#endif
