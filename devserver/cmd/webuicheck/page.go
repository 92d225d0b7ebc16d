package main

import (
	"context"
	"fmt"
	"strings"
)

// renderAttempts is how many times checkPageShows loads a page, doubling
// the render budget each time, before it concludes that the page does not
// show what it should. A page that shows it passes on the first.
const renderAttempts = 3

// checkPageShows loads page in browser and checks that its rendered DOM
// contains every string in want.
func checkPageShows(ctx context.Context, browser chromium, page string, want []string) error {
	var missing []string
	var rendered int
	for attempt, budget := 1, renderBudget; attempt <= renderAttempts; attempt, budget = attempt+1, budget*2 {
		dom, err := browser.dumpDOM(ctx, page, budget)
		if err != nil {
			return err
		}
		if missing, rendered = missingFrom(dom, want), len(dom); len(missing) == 0 {
			return nil
		}
	}
	return fmt.Errorf("the Web UI page %s does not show %s (%d bytes of DOM, %d loads)",
		page, strings.Join(quoteAll(missing), ", "), rendered, renderAttempts)
}

// missingFrom returns the strings of want that dom does not contain.
func missingFrom(dom string, want []string) []string {
	var missing []string
	for _, w := range want {
		if !strings.Contains(dom, w) {
			missing = append(missing, w)
		}
	}
	return missing
}
