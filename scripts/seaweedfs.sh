#!/usr/bin/env bash
# A SeaweedFS S3 server on this machine, for the object-store tests.
#
#   scripts/seaweedfs.sh build        print the weed binary's path, building it once
#   scripts/seaweedfs.sh start DIR    start weed with its data in DIR; DIR/env is
#                                     then the environment that reaches it
#   scripts/seaweedfs.sh stop DIR     stop it (DIR stays; the caller removes it)
#
# The binary is built from the module at SEAWEEDFS_VERSION and cached in
# ~/.cache/gymfleet/seaweedfs-<version>/weed: a clean build takes tens of
# minutes on two cores, so it happens once per machine. Ports are drawn from
# GYMFLEET_E2E_PORTS (lo-hi, default 12000-12999), each checked free.
set -euo pipefail

SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION=${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
CACHE=${GYMFLEET_CACHE:-$HOME/.cache/gymfleet}/seaweedfs-$SEAWEEDFS_VERSION
WEED=$CACHE/weed
GO=${GO:-go}

build() {
	if [ -x "$WEED" ]; then
		echo "$WEED"
		return
	fi
	mkdir -p "$CACHE"
	local src dir
	echo "building weed $SEAWEEDFS_VERSION (once; tens of minutes)" >&2
	dir=$(cd / && GOFLAGS=-mod=mod "$GO" mod download -json "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "seaweedfs.sh: go mod download gave no directory" >&2; exit 1; }
	# The module cache is read-only, and `go install mod@version` refuses
	# the replace directives in its go.mod: build in a writable copy.
	src=$(mktemp -d)
	cp -r "$dir/." "$src/"
	chmod -R u+w "$src"
	(cd "$src" && "$GO" build -o "$WEED.tmp" ./weed)
	mv "$WEED.tmp" "$WEED"
	rm -rf "$src"
	echo "$WEED"
}

# freeport prints a port of the range nobody listens on and not yet taken
# by this script (TAKEN).
TAKEN=" "
freeport() {
	local range=${GYMFLEET_E2E_PORTS:-12000-12999}
	local lo=${range%-*} hi=${range#*-} p tries=0
	while [ $tries -lt 500 ]; do
		p=$((lo + RANDOM % (hi - lo + 1)))
		tries=$((tries + 1))
		case "$TAKEN" in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			TAKEN="$TAKEN$p "
			echo "$p"
			return
		fi
	done
	echo "seaweedfs.sh: no free port in $range" >&2
	exit 1
}

# answers tells whether an HTTP server on port answers GET / with 200 or
# 403 (an anonymous request to a gateway that holds credentials).
answers() {
	local line
	{ exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
	printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
	read -r -t 5 line <&3 || line=
	exec 3<&- 3>&-
	case "$line" in *" 200 "* | *" 403 "*) return 0 ;; esac
	return 1
}

start() {
	local dir=$1 weed
	weed=$(build)
	mkdir -p "$dir/data"
	local key=gymfleet-test secret
	secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	cat >"$dir/s3.json" <<JSON
{"identities":[{"name":"gymfleet","credentials":[{"accessKey":"$key","secretKey":"$secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
	local master mgrpc volume vgrpc filer fgrpc s3 s3grpc iam
	master=$(freeport); TAKEN="$TAKEN$master "; mgrpc=$(freeport); TAKEN="$TAKEN$mgrpc "
	volume=$(freeport); TAKEN="$TAKEN$volume "; vgrpc=$(freeport); TAKEN="$TAKEN$vgrpc "
	filer=$(freeport); TAKEN="$TAKEN$filer "; fgrpc=$(freeport); TAKEN="$TAKEN$fgrpc "
	s3=$(freeport); TAKEN="$TAKEN$s3 "; s3grpc=$(freeport); TAKEN="$TAKEN$s3grpc "
	iam=$(freeport); TAKEN="$TAKEN$iam "
	echo "$mgrpc $vgrpc $fgrpc $s3grpc" >"$dir/grpc-ports"
	# glog writes beneath TMPDIR: the server's files all stay in dir.
	mkdir -p "$dir/tmp"
	TMPDIR="$dir/tmp" "$weed" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
		-master.port="$master" -master.port.grpc="$mgrpc" -master.volumeSizeLimitMB=1024 -master.telemetry=false \
		-volume.port="$volume" -volume.port.grpc="$vgrpc" -volume.max=0 \
		-filer.port="$filer" -filer.port.grpc="$fgrpc" -filer.localSocket="$dir/filer.sock" \
		-s3 -s3.port="$s3" -s3.port.grpc="$s3grpc" -s3.config="$dir/s3.json" -s3.localSocket="$dir/s3.sock" \
		-s3.port.iceberg=0 -s3.port.lance=0 -iam.port="$iam" \
		>"$dir/weed.log" 2>&1 &
	echo $! >"$dir/pid"
	local endpoint=http://127.0.0.1:$s3
	cat >"$dir/env" <<ENV
export GYMFLEET_S3_ENDPOINT=$endpoint
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
ENV
	# Ready once a signed request gets an S3 answer: any XML error for a
	# bucket that does not exist means the gateway and its filer are up.
	local deadline=$((SECONDS + 120))
	until answers "$s3"; do
		if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
			echo "seaweedfs.sh: weed exited; its log:" >&2
			tail -30 "$dir/weed.log" >&2
			exit 1
		fi
		if [ $SECONDS -ge $deadline ]; then
			echo "seaweedfs.sh: weed's S3 gateway did not answer within 120 s; its log:" >&2
			tail -30 "$dir/weed.log" >&2
			stop "$dir"
			exit 1
		fi
		sleep 0.5
	done
	echo "weed serves S3 at $endpoint (log $dir/weed.log)" >&2
}

stop() {
	local dir=$1 pid
	[ -f "$dir/pid" ] || return 0
	pid=$(cat "$dir/pid")
	kill "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 20))
	while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$dir/pid"
	# weed makes its gRPC sockets in /tmp whatever TMPDIR says.
	local p
	for p in $(cat "$dir/grpc-ports" 2>/dev/null); do
		rm -f /tmp/seaweedfs-*-grpc-"$p".sock
	done
}

case "${1:-}" in
build) build ;;
start) start "${2:?start DIR}" ;;
stop) stop "${2:?stop DIR}" ;;
*) echo "usage: $0 build | start DIR | stop DIR" >&2; exit 2 ;;
esac
