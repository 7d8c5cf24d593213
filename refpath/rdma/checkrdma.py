#!/usr/bin/env python3
"""Validates the truth files of the RDMA scenarios (rdmapath).

Usage: checkrdma.py DIR SCENARIO...

For each scenario both roles' files must exist and end with an end line whose
call count matches and which says the role verified its data. Per role: every
signaled WR (and every failed one) has exactly one send completion with the same
wr_id and qp_num and the matching opcode; successful ones carry byte_len = bytes.
Across roles: every WRITE_WITH_IMM/SEND has one receive completion at the peer
(RECV_RDMA_WITH_IMM with the same imm, or RECV), consuming a posted RECV; the
WRs' memory kinds and data flow are what the scenario does; at least one post
call carries a chain of 4 WRs and some WRs carry 2 SGEs. Rates: pd-overlap must
be slower together, pd-send-duplex must not (loose bounds: on 2 vCPUs the
copies' CPU time adds noise to the RDMA side).
"""
import json
import sys

WC_FOR = {"RDMA_WRITE": "RDMA_WRITE", "RDMA_WRITE_WITH_IMM": "RDMA_WRITE", "RDMA_READ": "RDMA_READ",
          "SEND": "SEND", "SEND_WITH_IMM": "SEND"}

# scenario -> initiator role, opcode of the page WRs, local_mem, remote_mem, data_flow
EXPECT = {
    "pd-transfer": ("prefill", "RDMA_WRITE_WITH_IMM", "device", "device", "local_to_remote"),
    "pd-overlap": ("prefill", "RDMA_WRITE_WITH_IMM", "pinned", "device", "local_to_remote"),
    "pd-send-duplex": ("decode", "RDMA_WRITE", "device", "host", "local_to_remote"),
    "rdma-read": ("decode", "RDMA_READ", "device", "device", "remote_to_local"),
    "rdma-write-serial": ("prefill", "RDMA_WRITE", "pinned", "device", "local_to_remote"),
    "rdma-write-pipelined": ("prefill", "RDMA_WRITE", "pinned", "device", "local_to_remote"),
    # the ordering scenarios (seed 002 §4.1, §5): kv-notify-imm's last page is its WRITE_WITH_IMM
    "kv-notify-early": ("prefill", "RDMA_WRITE", "device", "device", "local_to_remote"),
    "kv-notify-imm": ("prefill", "RDMA_WRITE", "device", "device", "local_to_remote"),
    "kv-notify-polled": ("prefill", "RDMA_WRITE", "device", "device", "local_to_remote"),
    "kv-notify-concurrent": ("prefill", "RDMA_WRITE", "device", "device", "local_to_remote"),
    "mr-dereg-early": ("prefill", "RDMA_WRITE", "host", "device", "local_to_remote"),
    "mr-dereg-polled": ("prefill", "RDMA_WRITE", "host", "device", "local_to_remote"),
}

# Scenarios that post one WR at a time: no chains, no WR of 2 SGEs.
ONE_AT_A_TIME = {"rdma-write-serial"}


def load(path):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    if not lines or lines[-1].get("end") is not True:
        raise ValueError("%s: no end line" % path)
    end, calls = lines[-1], lines[:-1]
    if end.get("calls") != len(calls):
        raise ValueError("%s: end line says %s calls, file has %d" % (path, end.get("calls"), len(calls)))
    if end.get("verified") is not True:
        raise ValueError("%s: the role did not verify its data" % path)
    for c in calls:
        for k in ("seq", "scenario", "role", "pid", "tid", "api", "op"):
            if k not in c:
                raise ValueError("%s: seq %s lacks %s" % (path, c.get("seq"), k))
    return end, calls


def check(d, sc):
    errs = []
    roles = {}
    for r in ("prefill", "decode"):
        roles[r] = load("%s/%s-%s.jsonl" % (d, sc, r))
    init, opc, lmem, rmem, flow = EXPECT[sc]
    peer = {"prefill": "decode", "decode": "prefill"}
    expected_errors = roles[init][0].get("expected_errors", 0)
    nerr = 0
    for r, (end, calls) in roles.items():
        posts = [c for c in calls if c["op"] == "post_send"]
        comps = [c for c in calls if c["op"] == "completion"]
        sends = [c for c in comps if c["cq"] == "send"]
        recvs = [c for c in comps if c["cq"] == "recv"]
        nerr += sum(1 for c in comps if c["status"] != 0)
        by_id = {}
        for c in sends:
            by_id.setdefault((c["wr_id"], c["qp_num"]), []).append(c)
        for p in posts:
            got = by_id.get((p["wr_id"], p["qp_num"]), [])
            failed = any(c["status"] != 0 for c in got)
            if p["signaled"] or failed:
                if len(got) != 1:
                    errs.append("%s %s: WR wr_id %d has %d send completions" % (sc, r, p["wr_id"], len(got)))
                    continue
                c = got[0]
                if c["wc_opcode"] != WC_FOR[p["opcode"]]:
                    errs.append("%s %s: WR %d %s completed as %s" % (sc, r, p["wr_id"], p["opcode"], c["wc_opcode"]))
                if c["status"] == 0 and c["byte_len"] != p["bytes"]:
                    errs.append("%s %s: WR %d byte_len %d != %d" % (sc, r, p["wr_id"], c["byte_len"], p["bytes"]))
                if c["t_poll_ns"] < p["t_post_ns"]:
                    errs.append("%s %s: WR %d completed before it was posted" % (sc, r, p["wr_id"]))
            elif got:
                errs.append("%s %s: unsignaled WR %d has a completion" % (sc, r, p["wr_id"]))
        # what the peer sent that needs a RECV here
        pposts = [c for c in roles[peer[r]][1] if c["op"] == "post_send"]
        need = [p for p in pposts if p["opcode"] in ("RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM")]
        if len(recvs) != len(need):
            errs.append("%s %s: %d receive completions for %d peer WRs that consume a RECV" % (sc, r, len(recvs), len(need)))
        posted_recv = {c["wr_id"] for c in calls if c["op"] == "post_recv"}
        for c in recvs:
            if c["wr_id"] not in posted_recv:
                errs.append("%s %s: receive completion for unposted RECV %d" % (sc, r, c["wr_id"]))
        imms = sorted(p["imm"] for p in need if p["opcode"] != "SEND")
        got_imms = sorted(c["imm"] for c in recvs if c["wc_opcode"] == "RECV_RDMA_WITH_IMM")
        if imms != got_imms:
            errs.append("%s %s: imm values of RECV_RDMA_WITH_IMM completions differ from the peer's WRs" % (sc, r))
        if r == init:
            pages = [p for p in posts if p["opcode"] == opc and p["remote_mem"] != "unknown"]
            want = end["pages"] * (2 if sc in ("pd-overlap", "pd-send-duplex") else 1) - (sc == "kv-notify-imm")
            if len(pages) != want:
                errs.append("%s %s: %d %s WRs for %d pages" % (sc, r, len(pages), opc, end["pages"]))
            for p in pages:
                if (p["local_mem"], p["remote_mem"], p["data_flow"]) != (lmem, rmem, flow):
                    errs.append("%s %s: WR %d is %s->%s %s, want %s %s %s" % (sc, r, p["wr_id"], p["local_mem"],
                                p["remote_mem"], p["data_flow"], lmem, rmem, flow))
                    break
            if sc not in ONE_AT_A_TIME and not any(p["chain_index"] == 3 for p in posts):
                errs.append("%s %s: no chain of 4 WRs in one post" % (sc, r))
            if sc not in ONE_AT_A_TIME and not any(p["num_sge"] == 2 for p in posts):
                errs.append("%s %s: no WR with 2 SGEs" % (sc, r))
            if sc in ONE_AT_A_TIME and any(p["chain_index"] > 0 for p in posts):
                errs.append("%s %s: a chain of WRs in one post" % (sc, r))
            regs = [c for c in calls if c["op"] == "reg_mr"]
            if not regs or not any(c["mem"] == lmem for c in regs):
                errs.append("%s %s: no %s registration" % (sc, r, lmem))
    if nerr != expected_errors:
        errs.append("%s: %d failed completions, expected %d" % (sc, nerr, expected_errors))
    g = roles["decode"][0].get("gbps", {})
    sd = roles["decode"][0].get("slowdown", {})
    note = " ".join("%s=%.2f" % kv for kv in sorted(g.items()))
    if sc == "pd-overlap" and (sd.get("rdma", 0) < 1.2 and sd.get("h2d", 0) < 1.2):
        errs.append("pd-overlap: no slowdown together (%s)" % sd)
    # The lane model must not slow H2D down for an outbound RDMA send. The send's own
    # rate also depends on CPU time for the copies (2 vCPUs), hence the looser bound.
    if sc == "pd-send-duplex" and (sd.get("h2d", 9) > 1.35 or sd.get("rdma", 9) > 1.8):
        errs.append("pd-send-duplex: opposite directions slowed down (%s)" % sd)
    return errs, note


def main():
    d, scs = sys.argv[1], sys.argv[2:]
    bad = False
    for sc in scs:
        try:
            errs, note = check(d, sc)
        except (OSError, ValueError, KeyError) as e:
            errs, note = ["%s: %s" % (sc, e)], ""
        for e in errs:
            print("  " + e)
        print("%-16s %s  %s" % (sc, "BAD" if errs else "ok", note))
        bad |= bool(errs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
