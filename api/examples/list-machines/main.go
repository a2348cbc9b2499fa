// Command list-machines prints corrald's machine inventory, a page at a
// time, with the API module's client: an example of a program that uses
// Corral's API without the appliance's dependencies.
//
//	go run github.com/corralhq/corral/api/examples/list-machines -config /var/lib/corral/admin.conf
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/corralhq/corral/api/client"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

func main() {
	config := flag.String("config", "", "client configuration file (default $CORRAL_CONFIG, else ~/.config/corral/config.yaml)")
	contextName := flag.String("context", "", "context of the file (default: its current context)")
	pageSize := flag.Int("page-size", 500, "machines per call")
	flag.Parse()
	if err := run(*config, *contextName, int32(*pageSize)); err != nil {
		fmt.Fprintln(os.Stderr, "list-machines:", err)
		os.Exit(1)
	}
}

func run(config, contextName string, pageSize int32) error {
	c, err := client.Open(config, contextName)
	if err != nil {
		return err
	}
	defer c.Close()
	req := &inventoryv1.ListMachinesRequest{PageSize: pageSize, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := c.Machines.ListMachines(ctx, req)
		cancel()
		if err != nil {
			return err
		}
		for _, m := range resp.GetMachines() {
			fmt.Printf("%s\t%s\t%q\t%s\n", m.GetName(), m.GetState(), m.GetSerial(), m.GetBootMac())
		}
		if resp.GetNextPageToken() == "" {
			return nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}
