package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/deploy"
)

// completionTimeout bounds the List call that completes a resource name:
// a shell waits for it on every Tab.
const completionTimeout = 3 * time.Second

// maxCompletions bounds the names offered.
const maxCompletions = 2000

// completeKinds offers the kind names get, describe and delete accept:
// each kind's lower-case names (canonical and aliases).
func completeKinds(withGetOnly bool) []string {
	var out []string
	for _, rk := range deploy.DefaultRegistry().Kinds() {
		if _, ok := tableOf(rk); !ok {
			continue
		}
		for _, n := range append([]string{rk.Name}, rk.Aliases...) {
			if n == strings.ToLower(n) {
				out = append(out, n)
			}
		}
	}
	if withGetOnly {
		out = append(out, applianceNames...)
		out = append(out, standbyPoolNames...)
		out = append(out, eventNames...)
	}
	return out
}

// completeKindAndName is the ValidArgsFunction of `VERB KIND NAME`: kinds
// first, then the names of that kind's records from the API.
func (inv *invocation) completeKindAndName(get bool) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		switch len(args) {
		case 0:
			return completeKinds(get), cobra.ShellCompDirectiveNoFileComp
		case 1:
			var k *kind
			var err error
			if get {
				if isEventsKind(args[0]) {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				k, err = getKindArg(args[0])
			} else {
				k, err = kindArg(args[0])
			}
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return inv.recordNames(cmd, k), cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeNames is the ValidArgsFunction of a verb whose only argument
// is a record of kind k.
func (inv *invocation) completeNames(k *kind) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return inv.recordNames(cmd, k), cobra.ShellCompDirectiveNoFileComp
	}
}

// recordNames lists the names of k's records, quietly: any failure
// (no configuration, appliance unreachable, no permission) offers none.
func (inv *invocation) recordNames(cmd *cobra.Command, k *kind) []string {
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return nil
	}
	base := cmd.Context()
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithTimeout(base, min(inv.timeout, completionTimeout))
	defer cancel()
	ms, err := k.listAll(ctx, cc, pageQuery{}, maxCompletions)
	if err != nil {
		return nil
	}
	sortByName(ms)
	var out []string
	for _, m := range ms {
		if n := recordName(m); n != "" && len(out) < maxCompletions {
			out = append(out, n)
		}
	}
	return out
}

// argKinds maps the placeholders of a verb's usage line to the kind whose
// names complete them; "NAME" and "SOURCE" are the group's own kind.
var argKinds = map[string]*kind{
	"NODE":    nodeKind,
	"NETWORK": networkKind,
	"IMAGE":   imageKind,
	"BS":      blockStorageKind,
}

// newNameVerbs name a record that does not exist yet: nothing to complete.
var newNameVerbs = map[string]bool{"create": true, "enroll": true, "fetch": true, "apply": true, "generate": true}

// addCompletions gives every subcommand of group without one a
// ValidArgsFunction read from its usage line: a placeholder naming a kind
// (NAME, NODE, ...) completes that kind's record names from the API, and a
// choice (on|off|cycle) its words.
func (inv *invocation) addCompletions(group *cobra.Command, own *kind) {
	for _, sub := range group.Commands() {
		if sub.ValidArgsFunction != nil {
			continue
		}
		fields := strings.Fields(sub.Use)
		if len(fields) == 0 || newNameVerbs[fields[0]] {
			continue
		}
		var slots []string
		for _, f := range fields[1:] {
			if strings.HasPrefix(f, "[") || strings.HasPrefix(f, "-") {
				break
			}
			slots = append(slots, f)
		}
		if len(slots) == 0 {
			continue
		}
		sub.ValidArgsFunction = func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) >= len(slots) {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			slot := slots[len(args)]
			switch {
			case slot == "NAME" || slot == "SOURCE" || slot == "NAME|MAC":
				if own != nil {
					return inv.recordNames(cmd, own), cobra.ShellCompDirectiveNoFileComp
				}
			case argKinds[slot] != nil:
				return inv.recordNames(cmd, argKinds[slot]), cobra.ShellCompDirectiveNoFileComp
			case strings.Contains(slot, "|") && slot == strings.ToLower(slot):
				return strings.Split(slot, "|"), cobra.ShellCompDirectiveNoFileComp
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
	}
}
