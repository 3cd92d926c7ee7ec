# Hardening flags for everything the packages ship (sourced by build-release and
# build-pam-module), as Debian's dpkg-buildflags "hardening=+all" asks of C programs:
# full RELRO with BIND_NOW (the module is loaded into setuid su and sudo), and the C shims
# built with _FORTIFY_SOURCE and the stack protector (fortify needs -O2).
HARDENING=(
  -Xlinker -z -Xlinker relro -Xlinker -z -Xlinker now
  -Xcc -O2 -Xcc -D_FORTIFY_SOURCE=2 -Xcc -fstack-protector-strong
)
