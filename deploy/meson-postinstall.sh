#!/bin/sh
# meson install's last step, the same as the Debian package's postinst: on a
# real install (no DESTDIR) as root, create the pdserve user, /etc/pdserve and
# the deployment secret. Anything else (DESTDIR staging, a user install) only
# prints what to run.
set -eu
prefix=$MESON_INSTALL_PREFIX
sysusers=$prefix/lib/sysusers.d/pdserve.conf
tmpfiles=$prefix/lib/tmpfiles.d/pdserve.conf
secret=$prefix/$1/pdserve/pdserve-secret
if [ -n "${DESTDIR:-}" ] || [ "$(id -u)" != 0 ]; then
    echo "pdserve: as root, run: systemd-sysusers $sysusers; systemd-tmpfiles --create $tmpfiles; $secret"
    exit 0
fi
systemd-sysusers "$sysusers"
systemd-tmpfiles --create "$tmpfiles"
"$secret"
