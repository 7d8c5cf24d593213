package ktext

import (
	"bufio"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestScanLF(t *testing.T) {
	sc := bufio.NewScanner(strings.NewReader("a\r\n\nb c\r"))
	sc.Split(ScanLF)
	var got []string
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if want := []string{"a\r", "", "b c\r"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLines(t *testing.T) {
	type seen struct {
		line int
		text string
	}
	var got []seen
	err := Lines(strings.NewReader("a\n\n \t\nb\r\n\r\nc"), "f", 64, func(line int, text string) error {
		got = append(got, seen{line, text})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// blank lines are skipped, yet counted
	if want := []seen{{1, "a"}, {4, "b\r"}, {6, "c"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}

	bad := errors.New("bad")
	err = Lines(strings.NewReader("a\n\nb\n"), "f", 64, func(line int, text string) error {
		if text == "b" {
			return bad
		}
		return nil
	})
	if !errors.Is(err, bad) || err.Error() != "f:3: bad" {
		t.Errorf("fn error: %v", err)
	}

	// (the scanner's first buffer holds 4 KiB: limits below that do not bite)
	err = Lines(strings.NewReader("a\n"+strings.Repeat("x", 1<<14)+"\n"), "f", 1<<13, func(int, string) error { return nil })
	if err == nil || !strings.HasPrefix(err.Error(), "f:2: ") || !errors.Is(err, bufio.ErrTooLong) {
		t.Errorf("long line: %v", err)
	}

	if err := Lines(strings.NewReader(""), "f", 64, func(int, string) error { t.Error("called on empty input"); return nil }); err != nil {
		t.Errorf("empty input: %v", err)
	}
}

func TestIsHex(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "09af": true, "ABCDEF": true, "fe:00": false, "": false,
		"0x1": false, "g": false, "-1": false, "+1": false, " 1": false, "ffffffffffffffffff": true,
	} {
		if got := IsHex(s); got != want {
			t.Errorf("IsHex(%q) = %v, want %v", s, got, want)
		}
	}
}
