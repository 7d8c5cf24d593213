// Package docs holds the tests that keep the prose in step with the tree:
// every relative link in README.md, CONTRIBUTING.md and docs/*.md reaches a
// file and, where it names one, a heading; CI runs the README's test command.
package docs

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's top directory.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// pages are the Markdown files whose links are checked, relative to root.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "CONTRIBUTING.md"}
	for _, d := range docs {
		out = append(out, filepath.Join("docs", filepath.Base(d)))
	}
	return out
}

// A link's text may run over a line break; its target may not.
var (
	linkRE  = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	fenceRE = regexp.MustCompile("(?m)^```")
	codeRE  = regexp.MustCompile("`[^`\n]*`")
)

// prose is a page without its fenced code blocks and code spans, where a
// bracket and a parenthesis are not a link. Line numbers are kept.
func prose(b string) string { return unfenced(b, true) }

// unfenced is a page without its fenced code blocks (a "# comment" there is
// no heading) and, with spans, without its code spans.
func unfenced(b string, spans bool) string {
	var out strings.Builder
	in := false
	for _, line := range strings.SplitAfter(b, "\n") {
		if fenceRE.MatchString(line) {
			in = !in
			out.WriteString("\n")
			continue
		}
		if in {
			out.WriteString("\n")
			continue
		}
		if spans {
			line = codeRE.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat(" ", len(s)) })
		}
		out.WriteString(line)
	}
	return out.String()
}

// Link is one relative link of a page, with the line it is on.
type link struct {
	line   int
	target string
}

// links lists a page's relative links: those without a scheme.
func links(text string) []link {
	var out []link
	for _, m := range linkRE.FindAllStringSubmatchIndex(text, -1) {
		target := text[m[2]:m[3]]
		if u, err := url.Parse(target); err == nil && u.Scheme != "" {
			continue
		}
		out = append(out, link{line: 1 + strings.Count(text[:m[0]], "\n"), target: target})
	}
	return out
}

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors are the headings' anchors of a Markdown page; a repeated heading
// gets -1, -2 … as GitHub numbers them.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(unfenced(text, false), "\n") {
		h, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		h = strings.TrimLeft(h, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		s := slug(strings.TrimSpace(h))
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// check says what is wrong with a link of page, or "".
func check(top, page, target string) string {
	path, frag, _ := strings.Cut(target, "#")
	file := filepath.Join(top, page)
	if path != "" {
		file = filepath.Join(top, filepath.Dir(page), path)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		if st, serr := os.Stat(file); serr == nil && st.IsDir() && frag == "" {
			return ""
		}
		return fmt.Sprintf("no file %s", strings.TrimPrefix(file, top+string(filepath.Separator)))
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return fmt.Sprintf("anchor #%s into %s, not a Markdown page", frag, path)
	}
	if !anchors(string(b))[frag] {
		return fmt.Sprintf("no heading with anchor #%s", frag)
	}
	return ""
}

func TestRelativeLinks(t *testing.T) {
	top := root(t)
	n := 0
	for _, page := range pages(t) {
		b, err := os.ReadFile(filepath.Join(top, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links(prose(string(b))) {
			n++
			if msg := check(top, page, l.target); msg != "" {
				t.Errorf("%s:%d: link %s: %s", page, l.line, l.target, msg)
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d relative links read: the link pattern no longer matches the pages", n)
	}
}

// The checker itself: a broken file, a broken anchor and a link hidden in
// code are told apart from good links.
func TestCheckFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	page := "# Title\n\n## 8. Conventions\n\n## `agent diagnose`\n\n## Twice\n\n## Twice\n\n" +
		"[ok](b.md#agent-memory) [self](#8-conventions) [code](#agent-diagnose) [second](#twice-1) [web](https://example.com/x)\n" +
		"[gone](missing.md) [bad anchor](b.md#nowhere)\n`[code](missing2.md)`\n```\n[fenced](missing3.md)\n```\n"
	if err := os.WriteFile(filepath.Join(dir, "a.md"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.md"), []byte("# B\n\n## Agent memory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range links(prose(page)) {
		if msg := check(dir, "a.md", l.target); msg != "" {
			got = append(got, fmt.Sprintf("%d %s: %s", l.line, l.target, msg))
		}
	}
	want := []string{"12 missing.md: no file missing.md", "12 b.md#nowhere: no heading with anchor #nowhere"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// CI runs exactly the test command the README gives.
func TestCIRunsREADMETestCommand(t *testing.T) {
	top := root(t)
	readme, err := os.ReadFile(filepath.Join(top, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## The two commands\n\n```sh\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal(`README.md: no "## The two commands" section opening with a sh block`)
	}
	var want string
	for _, line := range strings.Split(string(m[1]), "\n") {
		if cmd, _, _ := strings.Cut(line, "#"); strings.HasPrefix(cmd, "make test") {
			want = strings.TrimSpace(cmd)
		}
	}
	if want == "" {
		t.Fatal("README.md: the two commands name no `make test`")
	}
	ci, err := os.ReadFile(filepath.Join(top, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, line := range strings.Split(string(ci), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			last = l
		}
	}
	if last != want {
		t.Errorf(".ci/run ends with %q; the README's test command is %q", last, want)
	}
}
