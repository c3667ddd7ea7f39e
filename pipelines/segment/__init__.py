"""Segmentation of tracked objects: masks for new and changed tracks (or every frame for chosen
classes), attached as COCO RLE to the objects of the stream's `detections` events."""
