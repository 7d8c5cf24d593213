#!/bin/sh
# Checks the reference RDMA provider looks like a stripped Debian provider:
# the verbs entry points are exported, the data path (post_send, post_recv,
# poll_cq) is not in .dynsym and there is no .symtab; the debug copy still has
# them. Also checks that the scenario binary reaches the data path only through
# the inline ops calls (it imports no post/poll symbol).
# Usage: checksyms.sh build/rdma/libibverbs.so.1 build/bin/rdmapath
set -e
lib=$1 bin=$2 dbg=$(dirname "$1")/debug/$(basename "$1")
fail() { echo "checksyms: $*" >&2; exit 1; }
dyn=$(nm -D --defined-only "$lib")
for s in ibv_get_device_list ibv_free_device_list ibv_get_device_name ibv_open_device ibv_close_device \
	ibv_query_device ibv_alloc_pd ibv_dealloc_pd ibv_reg_mr ibv_reg_mr_iova2 ibv_reg_dmabuf_mr ibv_dereg_mr \
	ibv_create_cq ibv_destroy_cq ibv_create_qp ibv_destroy_qp ibv_modify_qp ibv_query_qp ibv_query_gid; do
	echo "$dyn" | grep -q " T $s@" || fail "$lib does not export $s"
done
echo "$dyn" | grep -Eiq "post_send|post_recv|poll_cq|req_notify" && fail "$lib exports a data-path symbol"
readelf -S "$lib" | grep -q '\.symtab' && fail "$lib is not stripped (.symtab present)"
nm "$dbg" | grep -q ' t ref_post_send$' || fail "$dbg lacks the local symbol ref_post_send"
nm "$dbg" | grep -q ' t ref_poll_cq$' || fail "$dbg lacks the local symbol ref_poll_cq"
objdump -d --no-show-raw-insn "$dbg" | grep -A1 '<ibv_reg_mr_iova2>:' | grep -q endbr64 || fail "$dbg is not built with CET"
nm -D --undefined-only "$bin" | grep -Eq "post_send|post_recv|poll_cq" && fail "$bin imports a data-path symbol"
nm -D --undefined-only "$bin" | grep -q "ibv_reg_mr@" || fail "$bin does not import ibv_reg_mr"
echo "checksyms: ok ($(echo "$dyn" | grep -c ' T ibv_') exported verbs, data path hidden, stripped)"
