package imagecache

import (
	"errors"
	"testing"
)

func TestChoose(t *testing.T) {
	for name, tc := range map[string]struct {
		euid     int
		exists   []string
		writable []string
		user     string
		want     string
	}{
		"root":                        {euid: 0, want: System},
		"root, only the older cache":  {euid: 0, exists: []string{legacy}, want: legacy},
		"root, both":                  {euid: 0, exists: []string{legacy, System}, want: System},
		"user who may write it":       {euid: 1000, exists: []string{System}, writable: []string{System}, user: "/home/u/.cache", want: System},
		"user who may create it":      {euid: 1000, writable: []string{"/var/cache/corral"}, user: "/home/u/.cache", want: System},
		"user without permission":     {euid: 1000, exists: []string{System}, user: "/home/u/.cache", want: "/home/u/.cache/corral/images"},
		"user, nothing there":         {euid: 1000, user: "/x/cache", want: "/x/cache/corral/images"},
		"user without a home":         {euid: 1000, want: System},
		"user, older cache read-only": {euid: 1000, exists: []string{legacy}, user: "/home/u/.cache", want: "/home/u/.cache/corral/images"},
	} {
		t.Run(name, func(t *testing.T) {
			in := func(set []string) func(string) bool {
				return func(d string) bool {
					for _, s := range set {
						if s == d {
							return true
						}
					}
					return false
				}
			}
			got := choose(env{euid: tc.euid, exists: in(tc.exists), writable: in(tc.writable), userCache: func() (string, error) {
				if tc.user == "" {
					return "", errors.New("neither $XDG_CACHE_HOME nor $HOME is defined")
				}
				return tc.user, nil
			}})
			if got != tc.want {
				t.Errorf("choose = %q, want %q", got, tc.want)
			}
		})
	}
}
