package docgen

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Flags writes docs/flags.md: the agent's usage, then each command's text
// and every flag of its flag set with its default.
func Flags(w io.Writer, usage string, cmds []Command) error {
	var b strings.Builder
	b.WriteString("# Commands and flags\n\n" + generated + "\n")
	fmt.Fprintf(&b, "```text\n%s```\n", usage)
	for _, c := range cmds {
		if c.Flags == nil {
			return fmt.Errorf("agent %s: no flag set", c.Name)
		}
		fmt.Fprintf(&b, "\n## agent %s\n\n```text\n%s\n```\n\n| flag | default | usage |\n|---|---|---|\n", c.Name, strings.TrimRight(c.About, "\n"))
		c.Flags.VisitAll(func(f *flag.Flag) {
			kind, text := flag.UnquoteUsage(f)
			name := "`--" + f.Name
			if kind != "" {
				name += " " + kind
			}
			def := ""
			if f.DefValue != "" {
				def = "`" + f.DefValue + "`"
			}
			fmt.Fprintf(&b, "| %s` | %s | %s |\n", name, cell(def), cell(text))
		})
	}
	_, err := io.WriteString(w, b.String())
	return err
}
