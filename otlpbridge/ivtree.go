package otlpbridge

import "math/rand/v2"

// ivTree holds spans ordered by start time (ties by arrival), each node
// knowing the latest end in its subtree, so the spans covering an instant
// are found without visiting the others: O((k+1)·log n) for k of them. It
// is a treap with random priorities, so no sender can unbalance it; insert and remove are O(log n)
// expected. A span's start and end must not change while it is held.
type ivTree struct {
	root *ivNode
	n    int
}

type ivNode struct {
	e           *entry
	left, right *ivNode
	prio        uint64
	maxEnd      int64
}

// ivNodeBytes is a node's size, for the index's memory budget.
const ivNodeBytes = 48

func before(a, b *entry) bool {
	if a.start != b.start {
		return a.start < b.start
	}
	return a.seq < b.seq
}

func (n *ivNode) fix() {
	m := n.e.end
	if n.left != nil {
		m = max(m, n.left.maxEnd)
	}
	if n.right != nil {
		m = max(m, n.right.maxEnd)
	}
	n.maxEnd = m
}

func (t *ivTree) insert(e *entry) {
	t.root = insertNode(t.root, &ivNode{e: e, prio: rand.Uint64(), maxEnd: e.end})
	t.n++
}

func insertNode(n, x *ivNode) *ivNode {
	if n == nil {
		return x
	}
	if before(x.e, n.e) {
		n.left = insertNode(n.left, x)
		if n.left.prio > n.prio {
			l := n.left
			n.left, l.right = l.right, n
			n.fix()
			n = l
		}
	} else {
		n.right = insertNode(n.right, x)
		if n.right.prio > n.prio {
			r := n.right
			n.right, r.left = r.left, n
			n.fix()
			n = r
		}
	}
	n.fix()
	return n
}

// remove takes e out; false when it was not held.
func (t *ivTree) remove(e *entry) bool {
	var ok bool
	t.root, ok = removeNode(t.root, e)
	if ok {
		t.n--
	}
	return ok
}

func removeNode(n *ivNode, e *entry) (*ivNode, bool) {
	if n == nil {
		return nil, false
	}
	var ok bool
	switch {
	case n.e == e:
		return merge(n.left, n.right), true
	case before(e, n.e):
		n.left, ok = removeNode(n.left, e)
	default:
		n.right, ok = removeNode(n.right, e)
	}
	if ok {
		n.fix()
	}
	return n, ok
}

// merge joins two treaps, every node of a before every node of b.
func merge(a, b *ivNode) *ivNode {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = merge(a.right, b)
		a.fix()
		return a
	default:
		b.left = merge(a, b.left)
		b.fix()
		return b
	}
}

// stab calls fn with each span covering t (start ≤ t ≤ end), latest start
// first, until fn returns false; it returns false when fn stopped it.
// visits counts the nodes looked at.
func (t *ivTree) stab(at int64, visits *uint64, fn func(*entry) bool) bool {
	if t == nil {
		return true
	}
	return stabNode(t.root, at, visits, fn)
}

func stabNode(n *ivNode, t int64, visits *uint64, fn func(*entry) bool) bool {
	if n == nil || n.maxEnd < t {
		return true
	}
	*visits++
	if n.e.start <= t {
		if !stabNode(n.right, t, visits, fn) {
			return false
		}
		if n.e.end >= t && !fn(n.e) {
			return false
		}
	}
	return stabNode(n.left, t, visits, fn)
}

// each calls fn with every span held.
func (t *ivTree) each(fn func(*entry)) {
	if t != nil {
		eachNode(t.root, fn)
	}
}

func eachNode(n *ivNode, fn func(*entry)) {
	if n != nil {
		eachNode(n.left, fn)
		fn(n.e)
		eachNode(n.right, fn)
	}
}
