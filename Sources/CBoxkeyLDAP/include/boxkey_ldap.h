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

void boxkey_ldap_close(boxkey_ldap *ld);

#endif
