// Package agent will own code that runs on a machine: discovery, install and
// the session client. It must not import store/, boot/, ipmi/ or bbolt.
package agent
